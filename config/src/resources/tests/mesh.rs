use super::*;
use crate::Duration;

const VALID: &str = r#"
type: Mesh
name: default
labels: {team: infra}
mtls:
  enabledBackend: ca-2
  secondaryBackends: [ca-1]
  backends:
    - name: ca-1
      type: builtin
      dpCert:
        rotation: {expiration: 1d}
      conf:
        caCert: {RSAbits: 2048, expiration: 10y}
    - name: ca-2
      type: provided
      mode: Permissive
      conf:
        cert: {file: certs/ca.pem}
        key: {inlineString: "-----BEGIN PRIVATE KEY-----"}
    - name: ca-3
      type: provided
      mode: STRICT
      conf:
        cert: {inline: "aGVsbG8="}
        key: {file: /etc/key.pem}
    - name: ca-4
      type: builtin
"#;

fn mesh(text: &str) -> Mesh {
    match one(text) {
        Resource::Mesh(mesh) => mesh,
        other => panic!("expected a Mesh, got {other:?}"),
    }
}

#[test]
fn valid_mesh_is_typed() {
    let mesh = mesh(VALID);
    assert_eq!(mesh.name, "default");
    assert_eq!(mesh.labels.get("team").map(String::as_str), Some("infra"));
    assert_eq!(
        mesh.source,
        Source {
            file: FILE.into(),
            document: 1
        }
    );
    let mtls = mesh.mtls.as_ref().expect("mtls");
    assert_eq!(mtls.enabled().map(|b| b.name.as_str()), Some("ca-2"));
    assert_eq!(
        mtls.secondaries()
            .map(|b| b.name.as_str())
            .collect::<Vec<_>>(),
        ["ca-1"]
    );
    assert_eq!(mtls.backends.len(), 4);

    let ca1 = mtls.backend("ca-1").expect("ca-1");
    assert_eq!(ca1.mode, MtlsMode::Strict);
    assert_eq!(ca1.dp_cert_expiration, Some(Duration::from_secs(86_400)));
    assert_eq!(
        ca1.kind,
        BackendKind::Builtin {
            ca_rsa_bits: Some(2048),
            ca_expiration: Some(Duration::from_secs(10 * 365 * 86_400)),
        }
    );

    let ca2 = mtls.backend("ca-2").expect("ca-2");
    assert_eq!(ca2.mode, MtlsMode::Permissive);
    assert_eq!(
        ca2.kind,
        BackendKind::Provided {
            cert: DataSource::File("/r/certs/ca.pem".into()),
            key: DataSource::InlineString("-----BEGIN PRIVATE KEY-----".into()),
        }
    );

    let ca3 = mtls.backend("ca-3").expect("ca-3");
    assert_eq!(ca3.mode, MtlsMode::Strict);
    assert_eq!(
        ca3.kind,
        BackendKind::Provided {
            cert: DataSource::Inline(b"hello".to_vec()),
            key: DataSource::File("/etc/key.pem".into()),
        }
    );
    assert_eq!(
        mtls.backend("ca-4").map(|b| &b.kind),
        Some(&BackendKind::Builtin {
            ca_rsa_bits: None,
            ca_expiration: None
        })
    );
}

#[test]
fn mesh_without_mtls_and_with_kuma_sections() {
    let mesh = mesh("type: Mesh\nname: m\nlogging: {backends: []}\nmetrics: {}\nskipCreatingInitialPolicies: ['*']\ncreationTime: x\n");
    assert_eq!(mesh.mtls, None);
}

#[test]
fn typo_in_a_field_name_is_reported_with_its_path() {
    let e =
        one_error("type: Mesh\nname: default\nmtls:\n  enabledBackends: ca-1\n  backends: []\n");
    assert_error(
        &e,
        "mtls.enabledBackends",
        "unknown field `enabledBackends`",
    );
    assert!(e.message.contains("line 4"), "{e}");
    assert_eq!(e.resource.as_deref(), Some("Mesh/default"));
    assert!(
        e.to_string().starts_with(
            "/r/test.yaml: Mesh/default: mtls.enabledBackends: unknown field `enabledBackends`"
        ),
        "{e}"
    );
}

#[test]
fn rsa_bits_must_be_a_supported_size() {
    let e = one_error(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - {name: a, type: builtin}\n  - name: b\n    type: builtin\n    conf:\n      caCert: {RSAbits: 1024}\n",
    );
    assert_error(
        &e,
        "mtls.backends[1].conf.caCert.RSAbits",
        "must be 2048, 3072 or 4096, got 1024",
    );
    let e = one_error(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - name: b\n    type: builtin\n    conf:\n      caCert: {RSAbits: lots}\n",
    );
    assert_error(
        &e,
        "mtls.backends[0].conf.caCert.RSAbits",
        "invalid type: string \"lots\"",
    );
}

#[test]
fn unknown_backend_type_lists_the_supported_ones() {
    let e = one_error("type: Mesh\nname: m\nmtls:\n  backends:\n  - {name: v, type: vault}\n");
    assert_error(
        &e,
        "mtls.backends[0].type",
        "\"vault\" backends are not served by meshca; use builtin or provided",
    );
    let e = one_error("type: Mesh\nname: m\nmtls:\n  backends:\n  - {name: v, type: Builtin}\n");
    assert_error(
        &e,
        "mtls.backends[0].type",
        r#""Builtin" must be one of ["builtin", "provided"]"#,
    );
}

#[test]
fn every_violation_of_a_mesh_backend_is_reported() {
    let errors = errors(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - name: a\n    type: builtin\n    mode: Lenient\n    dpCert: {rotation: {expiration: 1fortnight}}\n    conf: {caCert: {RSAbits: 1024, expiration: 0s}}\n  - {name: b, type: acmpca}\n",
    );
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "mtls.backends[0].dpCert.rotation.expiration",
            "mtls.backends[0].mode",
            "mtls.backends[0].conf.caCert.RSAbits",
            "mtls.backends[0].conf.caCert.expiration",
            "mtls.backends[1].type",
        ],
        "{errors:#?}"
    );
    assert!(errors[1].message.starts_with(r#""Lenient" must be one of"#));
}

#[test]
fn bad_durations_name_the_field() {
    let e = one_error(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - name: a\n    type: builtin\n    dpCert: {rotation: {expiration: 1fortnight}}\n",
    );
    assert_error(
        &e,
        "mtls.backends[0].dpCert.rotation.expiration",
        "unknown unit \"fortnight\"",
    );
    let e = one_error(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - name: a\n    type: builtin\n    conf: {caCert: {expiration: 0s}}\n",
    );
    assert_error(
        &e,
        "mtls.backends[0].conf.caCert.expiration",
        "must be greater than zero",
    );
}

#[test]
fn backend_references_must_resolve() {
    let errors = errors(
        r#"
type: Mesh
name: m
mtls:
  enabledBackend: ca-9
  secondaryBackends: [ca-1, ca-8, ca-1]
  backends:
    - {name: ca-1, type: builtin}
    - {name: ca-2, type: builtin}
"#,
    );
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_error(
        &errors[0],
        "mtls.enabledBackend",
        "no backend named \"ca-9\"; defined backends: ca-1, ca-2",
    );
    assert_error(
        &errors[1],
        "mtls.secondaryBackends[1]",
        "no backend named \"ca-8\"",
    );
    assert_error(
        &errors[2],
        "mtls.secondaryBackends[2]",
        "\"ca-1\" is listed twice",
    );
}

#[test]
fn backend_cannot_be_enabled_and_secondary() {
    let e = one_error(
        "type: Mesh\nname: m\nmtls:\n  enabledBackend: a\n  secondaryBackends: [a]\n  backends: [{name: a, type: builtin}]\n",
    );
    assert_error(
        &e,
        "mtls.secondaryBackends[0]",
        "cannot be both enabled and secondary",
    );
}

#[test]
fn backend_names_are_unique_and_valid() {
    let errors = errors(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - {name: a, type: builtin}\n  - {name: a, type: builtin}\n  - {name: B_1, type: builtin}\n",
    );
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(
        &errors[0],
        "mtls.backends[1].name",
        "another backend is already named \"a\"",
    );
    assert_error(&errors[1], "mtls.backends[2].name", "is not a valid name");
}

#[test]
fn provided_backend_data_sources_are_checked() {
    let errors = errors(
        r#"
type: Mesh
name: m
mtls:
  backends:
    - name: a
      type: provided
      conf:
        cert: {secret: "Not A Name!"}
        key: {inline: "not base64!"}
    - name: b
      type: provided
      conf:
        cert: {file: /a, inlineString: x}
    - name: c
      type: provided
      conf:
        caCert: {RSAbits: 2048}
        cert: {}
        key: {inlineString: k}
    - name: d
      type: builtin
      conf:
        cert: {file: /x}
"#,
    );
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "mtls.backends[0].conf.cert.secret",
            "mtls.backends[0].conf.key.inline",
            "mtls.backends[1].conf.cert",
            "mtls.backends[1].conf.key",
            "mtls.backends[2].conf.caCert",
            "mtls.backends[2].conf.cert",
            "mtls.backends[3].conf.cert",
        ],
        "{errors:#?}"
    );
    assert!(errors[0].message.contains("valid name"), "{}", errors[0]);
    assert!(errors[1].message.contains("not valid base64"));
    assert!(errors[2].message.contains(
        "set exactly one of file, inline, inlineString or secret; found file and inlineString"
    ));
    assert!(errors[3]
        .message
        .contains("required for a provided backend"));
    assert!(errors[5]
        .message
        .contains("set exactly one of file, inline, inlineString or secret"));
    assert!(errors[6]
        .message
        .contains("not allowed for a builtin backend"));
}

#[test]
fn mesh_has_no_mesh_field() {
    let e = one_error("type: Mesh\nname: m\nmesh: other\n");
    assert_error(&e, "mesh", "a Mesh belongs to no mesh");
}

#[test]
fn data_source_never_shows_inline_secrets() {
    let sources = [
        DataSource::Inline(b"secret-bytes".to_vec()),
        DataSource::InlineString("secret-text".into()),
    ];
    for source in &sources {
        let shown = format!("{source:?} {source}");
        assert!(!shown.contains("secret-"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
    assert_eq!(
        format!("{:?}", DataSource::File("/k.pem".into())),
        "File(\"/k.pem\")"
    );
}

#[test]
fn data_source_reads_its_bytes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, b"pem bytes").expect("write");
    assert_eq!(
        DataSource::File(path).read(1 << 20).expect("readable"),
        b"pem bytes"
    );
    assert_eq!(
        DataSource::Inline(vec![1, 2])
            .read(1 << 20)
            .expect("inline"),
        [1, 2]
    );
    assert_eq!(
        DataSource::InlineString("ab".into())
            .read(1 << 20)
            .expect("inline"),
        b"ab"
    );
    let missing = DataSource::File(dir.path().join("nope.pem"))
        .read(1 << 20)
        .unwrap_err();
    assert!(missing.to_string().contains("nope.pem"), "{missing}");
    let unset = DataSource::EnvVar("MESHCA_TEST_VARIABLE_THAT_IS_NEVER_SET".into())
        .read(1 << 20)
        .unwrap_err();
    assert_eq!(unset.kind(), std::io::ErrorKind::NotFound);
    assert!(
        unset
            .to_string()
            .contains("MESHCA_TEST_VARIABLE_THAT_IS_NEVER_SET"),
        "{unset}"
    );
    // PATH is set in any environment the tests run in; reading must not need it to be changed.
    if let Ok(path) = std::env::var("PATH") {
        assert_eq!(
            DataSource::EnvVar("PATH".into())
                .read(1 << 20)
                .expect("PATH"),
            path.into_bytes()
        );
    }
}

#[test]
fn mesh_services_mode_is_read_in_kumas_spellings_and_defaults_to_disabled() {
    assert_eq!(mesh(VALID).mesh_services, MeshServicesMode::Disabled);
    for (spelled, mode) in [
        ("Disabled", MeshServicesMode::Disabled),
        ("Everywhere", MeshServicesMode::Everywhere),
        ("ReachableBackends", MeshServicesMode::ReachableBackends),
        ("Exclusive", MeshServicesMode::Exclusive),
    ] {
        let text = format!("type: Mesh\nname: m\nmeshServices:\n  mode: {spelled}\n");
        assert_eq!(mesh(&text).mesh_services, mode, "{spelled}");
        assert_eq!(mode.as_str(), spelled);
    }
    assert_eq!(
        mesh("type: Mesh\nname: m\nmeshServices: {}\n").mesh_services,
        MeshServicesMode::Disabled
    );
}

#[test]
fn a_wrong_mesh_services_mode_is_refused_with_the_modes_kuma_knows() {
    let e = one_error("type: Mesh\nname: m\nmeshServices: {mode: exclusive}\n");
    assert_error(
        &e,
        "meshServices.mode",
        r#""exclusive" must be one of ["Disabled", "Everywhere", "ReachableBackends", "Exclusive"]"#,
    );
    let e = one_error("type: Mesh\nname: m\nmeshServices: {mode: Exclusive, enabled: true}\n");
    assert!(e.message.contains("enabled"), "{e:?}");
}
