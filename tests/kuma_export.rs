//! A mesh moved from Kuma with `kumactl export --include-admin` keeps its CA. The export writes each
//! builtin backend as `type: provided` whose `cert` and `key` name universal `Secret` resources (base64
//! PEM), with `skipValidation: true`. meshca serves such an export as is: its proxies get certificates
//! from the very CA Kuma had (an RSA 2048 CA with a PKCS#1 key, made here as Kuma's builtin CA makes
//! one), with Kuma's legacy SPIFFE IDs, and no Secret's bytes reach the log.

mod common;

use std::process::Command;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use common::{pem_certs, webpki_verify, Env, DATAPLANE_WEB_1};

/// A CA as Kuma's builtin backend makes one: RSA 2048, a PKCS#1 key, the mesh's SPIFFE ID; its
/// certificate and key PEM.
fn kuma_builtin_ca(dir: &std::path::Path) -> (String, String) {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
        ])
        .args(["-subj", "/O=Kuma/OU=Mesh/CN=default"])
        .args(["-addext", "subjectAltName=URI:spiffe://default"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs (Debian's openssl package)");
    assert!(made.status.success(), "{made:?}");
    let pkcs1 = Command::new("openssl")
        .args(["rsa", "-traditional", "-in"])
        .arg(&key)
        .output()
        .expect("openssl runs");
    assert!(pkcs1.status.success(), "{pkcs1:?}");
    let key_pem = String::from_utf8(pkcs1.stdout).expect("PEM");
    assert!(
        key_pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
        "PKCS#1, as Kuma writes it"
    );
    (std::fs::read_to_string(&cert).expect("written"), key_pem)
}

/// What `kumactl export --profile all --format universal --include-admin` writes for mesh `default`
/// with builtin backend `ca-1`.
fn export(cert_pem: &str, key_pem: &str) -> String {
    format!(
        r#"type: Mesh
name: default
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
kri: kri_m____default_
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: provided
      dpCert:
        rotation:
          expiration: 24h
      conf:
        cert:
          secret: default.ca-builtin-cert-ca-1
        key:
          secret: default.ca-builtin-key-ca-1
        skipValidation: true
---
type: Secret
mesh: default
name: default.ca-builtin-cert-ca-1
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
data: {}
---
type: Secret
mesh: default
name: default.ca-builtin-key-ca-1
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
data: {}
---
type: MeshInsight
name: default
dataplanes: {{total: 1, online: 1}}
"#,
        STANDARD.encode(cert_pem),
        STANDARD.encode(key_pem)
    )
}

#[test]
fn a_kumactl_export_with_its_secrets_keeps_the_mesh_ca_and_the_spiffe_ids() {
    let env = Env::new();
    let (cert_pem, key_pem) = kuma_builtin_ca(env.root());
    env.write_resource("export.yaml", &export(&cert_pem, &key_pem));
    env.write_resource("web-1.yaml", DATAPLANE_WEB_1);

    let validated = env.cli(&["validate", "--config", env.cfg(), "--output", "json"]);
    assert_eq!(validated.code(), Some(0), "{validated}");
    let report = validated.json();
    assert!(
        report["warnings"].to_string().contains("MeshInsight"),
        "the Insight is noted: {report}"
    );

    let daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    let chain = pem_certs(&env.fetch_identity(&token));
    let kuma_ca = pem_certs(&cert_pem);
    webpki_verify(&chain, &kuma_ca).expect("the SVID verifies against the CA Kuma had");
    let leaf_pem = pem::encode(&pem::Pem::new("CERTIFICATE", chain[0].clone()));
    let leaf = env.inspect(&leaf_pem);
    assert_eq!(leaf[0]["spiffe_ids"][0], "spiffe://default/web", "{leaf:?}");

    let log = daemon.log();
    let key_body: String = key_pem.lines().nth(3).unwrap_or_default().to_owned();
    assert!(
        !key_body.is_empty() && !log.contains(&key_body),
        "no key bytes in the log"
    );
    assert!(
        !log.contains(&STANDARD.encode(&key_pem)[..40]),
        "no Secret data in the log"
    );
}

#[test]
fn a_backend_naming_a_secret_that_is_not_there_is_refused_naming_the_field() {
    let env = Env::new();
    let (cert_pem, key_pem) = kuma_builtin_ca(env.root());
    let text = export(&cert_pem, &key_pem).replacen(
        "default.ca-builtin-key-ca-1\n",
        "default.ca-builtin-key-ca-9\n",
        1,
    );
    env.write_resource("export.yaml", &text);
    let validated = env.cli(&["validate", "--config", env.cfg()]);
    assert_eq!(validated.code(), Some(2), "{validated}");
    let text = validated.to_string();
    assert!(
        text.contains("Mesh/default")
            && text.contains("mtls.backends[0].conf.key.secret")
            && text.contains("no Secret named \"default.ca-builtin-key-ca-9\""),
        "{text}"
    );
}
