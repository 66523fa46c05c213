//! `meshca workload fetch` against a running `meshca serve`: what the command prints and writes, checked
//! by code that is not meshca's (x509-parser and ring for the key, rustls-webpki for the chain), and its
//! errors for an unregistered process and a bad socket address.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{mode, my_uid, pem_certs, uri_sans, webpki_verify, Env, Run};

/// A mesh whose MeshIdentity makes its own CA, a second mesh (another trust domain, which the first
/// trusts through `ALL`), and the Dataplane a registration names.
const MESHES: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
---
type: MeshIdentity
name: identity
mesh: default
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
---
type: Mesh
name: other
meshServices:
  mode: Exclusive
---
type: MeshIdentity
name: identity
mesh: other
spec:
  selector:
    dataplane:
      matchLabels: {}
  spiffeID:
    trustDomain: "{{ .Mesh }}.{{ .Zone }}.mesh.local"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Enabled
      autogenerate:
        enabled: true
---
type: Dataplane
mesh: default
name: batch-1
labels:
  kuma.io/workload: batch
"#;

const SPIFFE_ID: &str = "spiffe://default.default.mesh.local/workload/batch";
const TRUST_DOMAIN: &str = "default.default.mesh.local";

fn registration(uid: &str) -> String {
    format!(
        "type: WorkloadRegistration\nmesh: default\nname: batch\nspec:\n  dataplane: batch-1\n  \
         selectors: [\"unix:uid:{uid}\"]\n  hint: main\n"
    )
}

/// An environment whose daemon serves the Workload API on `<root>/w.sock`, with a registration for `uid`.
fn env_for(uid: &str) -> (Env, PathBuf) {
    let env = Env::with_settings("");
    let socket = env.root().join("w.sock");
    let settings = std::fs::read_to_string(&env.config).expect("the settings file");
    std::fs::write(
        &env.config,
        format!(
            "{settings}workloadApi: {{listen: [\"unix://{}\"]}}\n",
            socket.display()
        ),
    )
    .expect("the temp dir is writable");
    env.write_resource("mesh.yaml", MESHES);
    env.write_resource("workloads.yaml", &registration(uid));
    (env, socket)
}

/// `meshca workload fetch ARGS` with no `SPIFFE_ENDPOINT_SOCKET` from the caller, or this one.
fn fetch(env: &Env, endpoint: Option<&str>, args: &[&str]) -> Run {
    let mut all = vec!["workload", "fetch"];
    all.extend_from_slice(args);
    let mut cmd: Command = env.command(&all);
    match endpoint {
        Some(value) => cmd.env("SPIFFE_ENDPOINT_SOCKET", value),
        None => cmd.env_remove("SPIFFE_ENDPOINT_SOCKET"),
    };
    env.cli_with(cmd, &all)
}

fn socket_arg(socket: &Path) -> String {
    format!("unix://{}", socket.display())
}

/// The three files of `--write`, checked: key 0600 and the leaf's, chain verified by bundle.pem.
fn check_written(dir: &Path) {
    assert_eq!(mode(&dir.join("key.pem")), 0o600, "key.pem must be 0600");
    let svid = std::fs::read_to_string(dir.join("svid.pem")).expect("svid.pem");
    let bundle = std::fs::read_to_string(dir.join("bundle.pem")).expect("bundle.pem");
    let key = std::fs::read_to_string(dir.join("key.pem")).expect("key.pem");
    let chain = pem_certs(&svid);
    let anchors = pem_certs(&bundle);
    assert!(!chain.is_empty() && !anchors.is_empty());
    assert_eq!(uri_sans(&chain[0]), [SPIFFE_ID]);
    webpki_verify(&chain, &anchors).expect("svid.pem chains to bundle.pem");

    let block = ::pem::parse(&key).expect("key.pem is PEM");
    assert_eq!(block.tag(), "PRIVATE KEY", "a PKCS#8 key");
    let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        block.contents(),
        &ring::rand::SystemRandom::new(),
    )
    .expect("an ECDSA P-256 PKCS#8 key");
    use ring::signature::KeyPair;
    use x509_parser::prelude::*;
    let (_, leaf) = X509Certificate::from_der(&chain[0]).expect("the leaf parses");
    assert_eq!(
        pair.public_key().as_ref(),
        leaf.public_key().subject_public_key.data.as_ref(),
        "key.pem is the leaf's key"
    );
}

#[test]
fn a_registered_process_fetches_writes_and_lists_bundles() {
    let (env, socket) = env_for(&my_uid());
    let _daemon = env.start();
    let sock = socket_arg(&socket);

    // Human output: the SPIFFE ID, hint, key type, the trust domain.
    let run = fetch(&env, None, &["--socket", &sock, "x509"]).ok();
    for expected in [
        SPIFFE_ID,
        "main",
        "ECDSA P-256",
        TRUST_DOMAIN,
        "other.default.mesh.local",
    ] {
        assert!(run.stdout.contains(expected), "{expected} missing: {run}");
    }

    // --write, with the socket from SPIFFE_ENDPOINT_SOCKET and JSON output.
    let out = env.root().join("out");
    let run = fetch(
        &env,
        Some(&sock),
        &[
            "x509",
            "--write",
            out.to_str().expect("UTF-8"),
            "--output",
            "json",
        ],
    )
    .ok();
    let json = run.json();
    assert_eq!(json["svids"][0]["spiffe_id"], SPIFFE_ID, "{run}");
    assert_eq!(json["svids"][0]["hint"], "main");
    assert_eq!(json["svids"][0]["trust_domain"], TRUST_DOMAIN);
    assert_eq!(json["svids"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        json["federated_trust_domains"],
        serde_json::json!(["other.default.mesh.local"])
    );
    assert_eq!(
        json["written"]["key"],
        out.join("key.pem").display().to_string()
    );
    check_written(&out);
    let federated = std::fs::read_to_string(out.join("federated-other.default.mesh.local.pem"))
        .expect("the federated bundle was written");
    assert!(!pem_certs(&federated).is_empty());
    let own = pem_certs(&std::fs::read_to_string(out.join("bundle.pem")).expect("bundle.pem"));
    assert!(
        pem_certs(&federated).iter().all(|ca| !own.contains(ca)),
        "bundle.pem holds only the SVID's trust domain"
    );

    // --socket wins over the variable.
    let run = fetch(
        &env,
        Some("tcp://127.0.0.1:1"),
        &["--socket", &sock, "bundles"],
    )
    .ok();
    assert!(run.stdout.contains(TRUST_DOMAIN), "{run}");

    // bundles, through the settings' socket (no --socket, no variable).
    let run = fetch(&env, None, &["--config", env.cfg(), "bundles"]).ok();
    assert!(run.stdout.contains(TRUST_DOMAIN), "{run}");
    let run = fetch(
        &env,
        None,
        &["--config", env.cfg(), "bundles", "--output", "json"],
    )
    .ok();
    let domains: Vec<String> = run.json()["trust_domains"]
        .as_array()
        .unwrap_or_else(|| panic!("no trust_domains: {run}"))
        .iter()
        .map(|td| {
            assert!(!td["cas"].as_array().expect("cas").is_empty(), "{run}");
            td["trust_domain"].as_str().expect("a name").to_owned()
        })
        .collect();
    assert!(domains.contains(&TRUST_DOMAIN.to_owned()), "{run}");

    // JWT: the caller's SPIFFE ID, then its token (a compact JWS naming it, for the audience).
    let run = fetch(&env, None, &["--socket", &sock, "jwt", "--audience", "a"]).ok();
    let mut lines = run.stdout.lines();
    let id_line = lines.next().unwrap_or_else(|| panic!("no output: {run}"));
    assert!(
        id_line.starts_with(&format!("spiffe://{TRUST_DOMAIN}/")),
        "{run}"
    );
    let token = lines.next().unwrap_or_else(|| panic!("no token: {run}"));
    assert_eq!(token.split('.').count(), 3, "{run}");
}

#[test]
fn an_unregistered_process_is_told_it_has_no_identity() {
    let (env, socket) = env_for("4000000");
    let _daemon = env.start();
    let out = env.root().join("out");
    let run = fetch(
        &env,
        None,
        &[
            "--socket",
            &socket_arg(&socket),
            "x509",
            "--write",
            out.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(
        run.stderr
            .contains("no identity for this process: no WorkloadRegistration matches it (uid "),
        "{run}"
    );
    assert!(run.stderr.contains(&format!("uid {}", my_uid())), "{run}");
    assert!(!out.join("key.pem").exists(), "nothing written");
}

#[test]
fn bad_socket_addresses_exit_2_naming_where_they_came_from() {
    let env = Env::new();
    for bad in [
        "unix://relative.sock",
        "unix:w.sock",
        "tcp://127.0.0.1:1",
        "/abs/w.sock",
    ] {
        let run = fetch(&env, None, &["--socket", bad, "x509"]);
        assert_eq!(run.code(), Some(2), "{run}");
        assert!(run.stderr.contains("--socket"), "{run}");
        let run = fetch(&env, Some(bad), &["bundles"]);
        assert_eq!(run.code(), Some(2), "{run}");
        assert!(run.stderr.contains("SPIFFE_ENDPOINT_SOCKET"), "{run}");
    }
    // A well-formed address where nothing listens: exit 1, naming the socket.
    let missing = env.root().join("nothing.sock");
    let run = fetch(&env, Some(&socket_arg(&missing)), &["x509"]);
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(run.stderr.contains(&missing.display().to_string()), "{run}");
}
