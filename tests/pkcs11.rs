//! CA keys in a PKCS#11 token, against a real SoftHSM2 token made for each test (`meshca-testhsm`):
//! builtin CAs made in the token, a provided CA whose key is in it, the database's key-encryption key
//! sealed by it, start errors, and the token going away while the daemon runs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::{my_uid, wait_for, Env, DATAPLANE_WEB_1, MESH_BUILTIN};
use common::{pem_certs, walk, webpki_verify};
use meshca_keystore::CRASH_AT_ENV;
use meshca_testhsm::TestToken;
use meshca_testpg::TestPostgres;

/// An environment whose settings put CA keys in `token` (with `kind` as the keystore type and `extra`
/// settings lines), every command reaching the token.
fn env_with_token(token: &TestToken, extra: &str) -> Env {
    Env::with_settings(&format!("{}{extra}", token.settings_yaml("file"))).with_vars(token.env())
}

/// The certificates SDS serves `web-1`: its chain and the trusted CAs.
fn web_1_secrets(env: &Env) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let token = env.token("default", "web-1", &[]);
    let secrets = env.fetch_ok(&token, &["default", "mesh_ca:secret:default"]);
    let chain = secrets["default"]["tls_certificate"]["certificate_chain_pem"]
        .as_str()
        .expect("an identity");
    let trusted = secrets["mesh_ca:secret:default"]["validation_context"]["trusted_ca_pem"]
        .as_str()
        .expect("a validation context");
    (pem_certs(chain), pem_certs(trusted))
}

/// Every private key in PEM under `dir` whose public key is `public_key`.
fn private_keys_of(dir: &Path, public_key: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for file in walk(dir) {
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let Ok(blocks) = pem::parse_many(text.as_bytes()) else {
            continue;
        };
        for block in blocks.iter().filter(|b| b.tag().contains("PRIVATE KEY")) {
            let der = rustls_pki_types::PrivatePkcs8KeyDer::from(block.contents().to_vec());
            if let Ok(key) = rcgen::KeyPair::try_from(&der) {
                if rcgen::PublicKeyData::der_bytes(&key) == public_key {
                    found.push(file.display().to_string());
                }
            }
        }
    }
    found
}

/// The subjectPublicKey bits of a certificate.
fn public_key(der: &[u8]) -> Vec<u8> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("a certificate");
    cert.public_key().subject_public_key.data.to_vec()
}

#[test]
fn a_builtin_ca_is_made_in_the_token_and_no_file_holds_its_key() {
    let token = TestToken::new();
    let env = env_with_token(&token, "");
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
    let daemon = env.start();

    let (chain, trusted) = web_1_secrets(&env);
    webpki_verify(&chain, &trusted).expect("the leaf signed in the token verifies");
    let ca_dir = env.keystore().join("ca/default/backend/ca-1");
    assert!(!ca_dir.join("key.pem").exists(), "no CA key file");
    let reference = std::fs::read_to_string(ca_dir.join("key.pkcs11")).expect("the key's URI");
    assert!(
        reference.starts_with("pkcs11:token=meshca;object=") && reference.contains("type=private"),
        "{reference}"
    );
    let ca_public_key = public_key(&trusted[0]);
    assert!(
        private_keys_of(env.root(), &ca_public_key).is_empty(),
        "a file holds the CA's key"
    );
    // Nor the daemon's own keys: the token signing key and the SDS CA's key are in the token too, and no
    // file under the data directory holds a private key of any kind.
    let daemon_keys = env.keystore().join("daemon");
    for (absent, present) in [
        ("token-signing-key.p8", "token-signing-key.pkcs11"),
        ("sds-ca/key.pem", "sds-ca/key.pkcs11"),
    ] {
        assert!(!daemon_keys.join(absent).exists(), "{absent} exists");
        let uri = std::fs::read_to_string(daemon_keys.join(present)).expect(present);
        assert!(uri.starts_with("pkcs11:token=meshca;"), "{present}: {uri}");
    }
    for file in walk(&env.data) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("PRIVATE KEY"),
            "{} holds a private key",
            file.display()
        );
    }
    // The scan does find a key when there is one: the leaf's, written by `meshca issue`.
    let out = env.root().join("issued");
    let web = env.token("default", "web-1", &[]);
    env.cli(&[
        "issue",
        "--config",
        env.cfg(),
        "--out",
        out.to_str().expect("UTF-8"),
        "--server",
        &env.sds_unix(),
        "--token-file",
        web.file.to_str().expect("UTF-8"),
    ])
    .ok();
    let leaf = pem_certs(&std::fs::read_to_string(out.join("svid.pem")).expect("svid.pem"));
    assert_eq!(private_keys_of(&out, &public_key(&leaf[0])).len(), 1);

    let status = daemon.admin_json("/api/status");
    assert_eq!(status["keystore_token"]["up"], true, "{status}");
    assert_eq!(status["keystore_token"]["label"], "meshca", "{status}");
    let metrics = daemon.admin_get("/metrics").body;
    assert!(
        metrics.contains("meshca_keystore_token_up{token=\"meshca\"} 1"),
        "{metrics}"
    );

    // A restart loads the same CA from the token.
    daemon.stop();
    let _daemon = env.start();
    let (_, again) = web_1_secrets(&env);
    assert_eq!(again, trusted, "the same CA after a restart");

    // The CA a rotation switches to is made in the token too.
    env.write_resource(
        "mesh.yaml",
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-2\n  secondaryBackends: [ca-1]\n  backends:\n    - name: ca-1\n      type: builtin\n    - name: ca-2\n      type: builtin\n",
    );
    let ca_2 = env.keystore().join("ca/default/backend/ca-2");
    wait_for("ca-2 to be made", || {
        ca_2.join("key.pkcs11").exists().then_some(())
    });
    assert!(!ca_2.join("key.pem").exists());
}

#[test]
fn a_wrong_pin_a_missing_token_or_module_stop_the_start_naming_the_setting() {
    let token = TestToken::new();
    let wrong_pin = token.pin_file().with_file_name("wrong-pin");
    std::fs::write(&wrong_pin, "wrong-pin-4711\n").expect("writes");
    std::fs::set_permissions(&wrong_pin, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let module = token.module().display().to_string();
    let cases = [
        (
            format!("keystore:\n  pkcs11:\n    module: {module}\n    token: meshca\n    pinFile: {}\n", wrong_pin.display()),
            "keystore.pkcs11.pinFile",
        ),
        (
            format!("keystore:\n  pkcs11:\n    module: {module}\n    token: elsewhere\n    pinFile: {}\n", token.pin_file().display()),
            "keystore.pkcs11.token",
        ),
        (
            format!("keystore:\n  pkcs11:\n    module: /nonexistent/libvendor-pkcs11.so\n    token: meshca\n    pinFile: {}\n", token.pin_file().display()),
            "keystore.pkcs11.module",
        ),
    ];
    for (settings, setting) in cases {
        let env = Env::with_settings(&settings).with_vars(token.env());
        env.write_resource("mesh.yaml", MESH_BUILTIN);
        let (status, log) = match env.try_start_with(|_| {}) {
            Ok(_) => panic!("started despite a bad {setting}"),
            Err(failed) => failed,
        };
        assert!(!status.success());
        assert!(log.contains(setting), "{setting}: {log}");
        assert!(
            !log.contains("wrong-pin-4711"),
            "the PIN is never shown: {log}"
        );
        assert!(!log.contains("1234"), "the PIN is never shown: {log}");
    }
}

#[test]
fn a_provided_ca_names_its_key_in_the_token() {
    let token = TestToken::new();
    let env = env_with_token(&token, "");
    // The operator's CA: its key imported into the token, then the file destroyed.
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "operator root");
    params.subject_alt_names = vec![rcgen::SanType::URI(
        rcgen::string::Ia5String::try_from("spiffe://default").expect("IA5"),
    )];
    let cert = params.self_signed(&key).expect("a CA");
    let cert_file = env.root().join("ca.pem");
    std::fs::write(&cert_file, cert.pem()).expect("writes");
    let key_file = env.root().join("ca-key.pem");
    std::fs::write(&key_file, key.serialize_pem()).expect("writes");
    let imported = Command::new("softhsm2-util")
        .envs(token.env())
        .args([
            "--import",
            key_file.to_str().expect("UTF-8"),
            "--token",
            token.label(),
        ])
        .args([
            "--label",
            "operator-ca",
            "--id",
            "0a0b0c",
            "--pin",
            token.pin(),
        ])
        .output()
        .expect("softhsm2-util runs");
    assert!(imported.status.success(), "{imported:?}");
    std::fs::remove_file(&key_file).expect("removes");

    let mesh = |uri: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-p\n  backends:\n    - name: ca-p\n      type: provided\n      conf:\n        cert: {{file: {}}}\n        key: {{pkcs11: \"{uri}\"}}\n",
            cert_file.display()
        )
    };
    // A key that is not the certificate's is refused, naming the resource.
    let other = Command::new("softhsm2-util")
        .envs(token.env())
        .arg("--import")
        .arg({
            let path = env.root().join("other-key.pem");
            std::fs::write(
                &path,
                rcgen::KeyPair::generate().expect("a key").serialize_pem(),
            )
            .expect("writes");
            path
        })
        .args([
            "--token",
            token.label(),
            "--label",
            "not-the-ca",
            "--id",
            "0d",
            "--pin",
            token.pin(),
        ])
        .output()
        .expect("softhsm2-util runs");
    assert!(other.status.success(), "{other:?}");
    env.write_resource("mesh.yaml", &mesh("pkcs11:token=meshca;object=not-the-ca"));
    let run = env.cli(&["validate", "--config", env.cfg()]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains("mesh.yaml") && run.stderr.contains("not the certificate's key"),
        "{run}"
    );
    env.write_resource("mesh.yaml", &mesh("pkcs11:token=meshca;object=absent"));
    let run = env.cli(&["validate", "--config", env.cfg()]);
    assert!(
        run.stderr
            .contains("holds no private key labelled \"absent\""),
        "{run}"
    );
    env.write_resource(
        "mesh.yaml",
        &mesh("pkcs11:token=another;object=operator-ca"),
    );
    let run = env.cli(&["validate", "--config", env.cfg()]);
    assert!(
        run.stderr.contains("keystore.pkcs11.token is \"meshca\""),
        "{run}"
    );

    // By label and by id, the key signs leaves that verify to the operator's CA.
    env.write_resource(
        "mesh.yaml",
        &mesh("pkcs11:token=meshca;object=operator-ca;id=%0a%0b%0c"),
    );
    env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
    let _daemon = env.start();
    let (chain, trusted) = web_1_secrets(&env);
    assert_eq!(trusted, vec![cert.der().to_vec()]);
    webpki_verify(&chain, &trusted).expect("signed by the key in the token");
}

#[test]
fn a_token_lost_while_running_stops_signing_keeps_serving_and_recovers() {
    let token = TestToken::new();
    let env = env_with_token(&token, "");
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
    env.write_resource(
        "web-2.yaml",
        &DATAPLANE_WEB_1
            .replace("web-1", "web-2")
            .replace("10.0.0.1", "10.0.0.2"),
    );
    let daemon = env.start();
    let web_1 = env.token("default", "web-1", &[]);
    let served = env.fetch_identity(&web_1);
    let web_2 = env.token("default", "web-2", &[]);

    token.remove();
    let body = wait_for("/ready to say the token is gone", || {
        let r = daemon.admin_get("/ready");
        (r.status == 200 && r.body.contains("does not answer")).then_some(r.body)
    });
    assert!(
        body.contains("\"meshca\"") && body.contains("no new certificate"),
        "{body}"
    );
    let metrics = daemon.admin_get("/metrics").body;
    assert!(
        metrics.contains("meshca_keystore_token_up{token=\"meshca\"} 0"),
        "{metrics}"
    );
    let status = env
        .cli(&["status", "--admin", &daemon.admin.to_string()])
        .ok();
    assert!(status.stdout.contains("DOES NOT ANSWER"), "{status}");
    assert!(daemon.log().contains("does not answer"), "logged");
    // What is issued keeps being served; a proxy that had nothing gets nothing until the token returns.
    assert_eq!(env.fetch_identity(&web_1), served);
    let refused = env.fetch(&web_2, &["default"]);
    assert_ne!(refused.code(), Some(0), "{refused}");
    // The token signing key is in the token too: no token is minted while it is away, and the command
    // says which setting's token it could not reach.
    let mint = env.cli(&[
        "token",
        "--config",
        env.cfg(),
        "--mesh",
        "default",
        "--name",
        "web-3",
    ]);
    assert_ne!(mint.code(), Some(0), "{mint}");
    assert!(mint.stderr.contains("keystore.pkcs11"), "{mint}");

    token.restore();
    wait_for("/ready to say ready again", || {
        let r = daemon.admin_get("/ready");
        (r.status == 200 && r.body == "ready\n").then_some(())
    });
    let chain = pem_certs(&env.fetch_identity(&web_2));
    let (_, trusted) = web_1_secrets(&env);
    webpki_verify(&chain, &trusted).expect("signed once the token is back");
    assert!(daemon
        .admin_get("/metrics")
        .body
        .contains("meshca_keystore_token_up{token=\"meshca\"} 1"));
}

#[test]
fn postgres_replicas_unseal_with_a_key_encryption_key_in_the_token() {
    let token = TestToken::new();
    let pg = TestPostgres::start();
    let shared = tempfile::tempdir().expect("a temp dir");
    let password = shared.path().join("db-password");
    std::fs::write(&password, pg.password()).expect("writes");
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let replica = |name: &str| {
        let env = Env::with_settings(&format!(
            "{}  postgres:\n    url: {}\n    passwordFile: {}\nreplica:\n  name: {name}\n",
            token.settings_yaml("postgres"),
            pg.url(),
            password.display()
        ))
        .with_vars(token.env());
        env.write_resource("mesh.yaml", MESH_BUILTIN);
        env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
        env
    };
    let (a, b) = (replica("a"), replica("b"));
    let _daemon_a = a.start();
    let _daemon_b = b.start();
    let (chain_a, trusted_a) = web_1_secrets(&a);
    let (chain_b, trusted_b) = web_1_secrets(&b);
    assert_eq!(trusted_a, trusted_b, "one CA for both replicas");
    webpki_verify(&chain_a, &trusted_a).expect("verifies");
    webpki_verify(&chain_b, &trusted_b).expect("verifies");

    let dump = pg.dump("meshca");
    let text = String::from_utf8_lossy(&dump);
    assert!(
        text.contains("key-encryption-key-sealed-by-token"),
        "the sealed key is recorded"
    );
    assert!(
        text.contains("key.pkcs11"),
        "the CA key is named, not stored"
    );
    assert!(!text.contains("PRIVATE KEY"), "no key in the clear");

    // A replica with another token (same label, other keys) cannot open the database's key.
    let other = TestToken::new();
    let env = Env::with_settings(&format!(
        "{}  postgres:\n    url: {}\n    passwordFile: {}\nreplica:\n  name: c\n",
        other.settings_yaml("postgres"),
        pg.url(),
        password.display()
    ))
    .with_vars(other.env());
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    let (status, log) = match env.try_start_with(|_| {}) {
        Ok(_) => panic!("started with a token that does not hold the key-encryption key"),
        Err(failed) => failed,
    };
    assert!(!status.success());
    assert!(
        log.contains("keystore.pkcs11") && log.contains("meshca-key-encryption-key"),
        "{log}"
    );
}

#[test]
fn the_rotation_drill_makes_its_cas_in_the_token_and_removes_them_after() {
    let token = TestToken::new();
    let env = env_with_token(&token, "");
    let run = env.cli(&[
        "drill",
        "ca-rotation",
        "--pkcs11",
        "--config",
        env.cfg(),
        "--proxies",
        "8",
        "--handshakes",
        "800",
        "--output",
        "json",
    ]);
    assert_eq!(run.code(), Some(0), "{run}");
    let report = run.json();
    assert_eq!(report["ok"], true, "{run}");
    assert_eq!(report["pkcs11"]["token"], "meshca", "{run}");
    assert_eq!(
        report["pkcs11"]["ca_keys_in_token"], 2,
        "ca-1 and ca-2: {run}"
    );
    assert_eq!(report["pkcs11"]["ca_keys_in_files"], 0, "{run}");
    // SoftHSM2 keeps one file per object beside the token's own: none is left.
    let objects: Vec<String> = walk(&token.tokens_dir())
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".object") && n != "token.object")
        .collect();
    assert!(objects.is_empty(), "keys left in the token: {objects:?}");

    let run = Env::new().cli(&["drill", "ca-rotation", "--pkcs11"]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("keystore.pkcs11"), "{run}");
}

/// How many key pairs the keystore records in the token: one per `*.pkcs11` entry.
fn recorded_pairs(env: &Env) -> usize {
    walk(&env.keystore())
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "pkcs11"))
        .count()
}

/// The number of the first crash point of a first start whose step contains `step`, found by a start
/// (with a token of its own) that reaches every point without being killed.
fn crash_point_of(step: &str) -> u64 {
    let token = TestToken::new();
    let env = env_with_token(&token, "");
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    let daemon = env.start_with(|cmd| {
        cmd.env(CRASH_AT_ENV, u32::MAX.to_string());
    });
    let log = daemon.log();
    daemon.stop();
    let prefix = format!("{CRASH_AT_ENV}: crash point ");
    log.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .find(|rest| rest.contains(step))
        .and_then(|rest| rest.split(':').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no crash point \"{step}\" in a first start:\n{log}"))
}

#[test]
fn a_kill_between_making_a_ca_key_in_the_token_and_recording_it_leaves_nothing_behind() {
    for (step, recorded_before_the_kill) in [
        ("record the key of CA", false),
        ("label the key of CA", true),
    ] {
        let at = crash_point_of(step);
        let token = TestToken::new();
        let env = env_with_token(&token, "");
        env.write_resource("mesh.yaml", MESH_BUILTIN);
        env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
        let killed = env.try_start_with(|cmd| {
            cmd.env(CRASH_AT_ENV, at.to_string());
        });
        let Err((status, log)) = killed else {
            panic!("the start was not killed at crash point {at} ({step})");
        };
        assert_eq!(status.signal(), Some(9), "{step}: {status}\n{log}");
        let left = recorded_pairs(&env);
        let unrecorded = if recorded_before_the_kill { 0 } else { 2 };
        assert_eq!(
            token.object_count(),
            2 * left + unrecorded,
            "{step}: the kill leaves the CA's pair in the token, recorded or not, beside the others"
        );
        let ca_dir = env.keystore().join("ca/default/backend/ca-1");
        let before = std::fs::read(ca_dir.join("cert.pem")).ok();
        assert_eq!(before.is_some(), recorded_before_the_kill, "{step}");

        let daemon = env.start();
        let (chain, trusted) = web_1_secrets(&env);
        webpki_verify(&chain, &trusted).expect("the restarted daemon signs in the token");
        assert_eq!(
            token.object_count(),
            2 * recorded_pairs(&env),
            "{step}: after the restart the token holds the recorded pairs and nothing else"
        );
        let log = daemon.log();
        if let Some(before) = before {
            assert_eq!(
                std::fs::read(ca_dir.join("cert.pem")).expect("ca-1"),
                before,
                "{step}: the recorded CA is kept"
            );
            assert!(log.contains("labelled now"), "{step}: {log}");
        } else {
            assert!(log.contains("destroyed a key pair"), "{step}: {log}");
        }
        daemon.stop();
    }
}

/// `meshca workload fetch --socket SOCKET jwt --audience AUDIENCE --output json`.
fn fetch_jwt(env: &Env, socket: &Path, audience: &str) -> common::Run {
    let socket = format!("unix://{}", socket.display());
    let args = [
        "workload",
        "fetch",
        "--socket",
        &socket,
        "jwt",
        "--audience",
        audience,
        "--output",
        "json",
    ];
    env.cli_with(env.command(&args), &args)
}

#[test]
fn jwt_svids_are_signed_in_the_token_and_wait_while_it_is_gone() {
    let token = TestToken::new();
    let env = env_with_token(&token, "");
    let socket = env.root().join("w.sock");
    let settings = std::fs::read_to_string(&env.config).expect("the settings file");
    std::fs::write(
        &env.config,
        format!(
            "{settings}workloadApi: {{listen: [\"unix://{}\"]}}\n",
            socket.display()
        ),
    )
    .expect("the settings file is writable");
    env.write_resource(
        "mesh.yaml",
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\ntype: MeshIdentity\nname: identity\nmesh: default\nspec:\n  selector:\n    dataplane:\n      matchLabels: {}\n  spiffeID:\n    trustDomain: example.org\n    path: \"/workload/{{ .Workload }}\"\n  provider:\n    type: Bundled\n    bundled:\n      meshTrustCreation: Enabled\n      autogenerate:\n        enabled: true\n---\ntype: Dataplane\nmesh: default\nname: batch-1\nlabels:\n  kuma.io/workload: batch\n",
    );
    env.write_resource(
        "workloads.yaml",
        &format!(
            "type: WorkloadRegistration\nmesh: default\nname: batch\nspec:\n  dataplane: batch-1\n  selectors: [\"unix:uid:{}\"]\n",
            my_uid()
        ),
    );
    let _daemon = env.start();

    let run = fetch_jwt(&env, &socket, "a").ok();
    let jwt = run.json()["svids"][0]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("a token: {run}"))
        .to_owned();
    // The key is in the token: the keystore keeps its URI and public key, no private key.
    let keys = env.keystore().join("jwt-svid/example.org");
    assert!(!keys.join("1").exists(), "a software JWT key was written");
    let uri = std::fs::read_to_string(keys.join("1.pkcs11")).expect("the key's URI");
    assert!(uri.starts_with("pkcs11:token=meshca;"), "{uri}");
    let public =
        ::pem::parse(std::fs::read(keys.join("1.pub.pem")).expect("the public key")).expect("PEM");
    // The token's ES256 signature verifies with that key (ring, on the raw r||s of JWS).
    let (signed, signature) = jwt.rsplit_once('.').expect("a compact JWS");
    use base64::Engine as _;
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .expect("base64url");
    let point = &public.contents()[public.contents().len() - 65..];
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
        .verify(signed.as_bytes(), &signature)
        .expect("signed by the key in the token");

    // While the token is gone, no new token is signed: the caller is told, and nothing else is used.
    token.remove();
    let refused = fetch_jwt(&env, &socket, "b");
    assert_ne!(refused.code(), Some(0), "{refused}");
    assert!(
        refused.stderr.contains("PKCS#11") && refused.stderr.contains("UNAVAILABLE"),
        "{refused}"
    );
    token.restore();
    let again = wait_for("a JWT-SVID once the token is back", || {
        let run = fetch_jwt(&env, &socket, "c");
        (run.code() == Some(0)).then_some(run)
    });
    assert!(again.json()["svids"][0]["token"].is_string(), "{again}");
}
