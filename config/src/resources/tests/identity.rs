use super::*;
use crate::Duration;

const MESH: &str = "type: Mesh\nname: default\n---\n";

fn identity(text: &str) -> MeshIdentity {
    match one(text) {
        Resource::MeshIdentity(identity) => identity,
        other => panic!("expected a MeshIdentity, got {other:?}"),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn default_resources_parse_cleanly() {
    let resources = parse(default_resources_yaml()).expect("the default resources are valid");
    let checked = Resources::from_resources(resources).expect("and consistent");
    let mesh = checked.mesh("default").expect("a default Mesh");
    assert_eq!(mesh.mtls, None);
    let identities: Vec<&MeshIdentity> = checked.identities_in("default").collect();
    assert_eq!(identities.len(), 1);
    let identity = identities[0];
    assert_eq!(identity.name, "identity");
    assert!(identity.selects_all());
    assert_eq!(
        identity.spiffe_id,
        SpiffeIdTemplates {
            trust_domain: Some("{{ .Mesh }}.{{ .Zone }}.mesh.local".into()),
            path: Some("/workload/{{ .Workload }}".into()),
        }
    );
    assert_eq!(
        identity.provider,
        Some(Provider::Bundled(Bundled {
            mesh_trust_creation: true,
            insecure_allow_self_signed: false,
            expiry: None,
            ca: BundledCa::Autogenerate,
        }))
    );
}

#[test]
fn provided_ca_from_every_kind_of_source() {
    let identity = identity(
        r#"
type: MeshIdentity
name: web
mesh: default
labels: {team: web}
spec:
  selector:
    dataplane:
      matchLabels: {app: web}
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Disabled
      insecureAllowSelfSigned: true
      certificateParameters: {expiry: 24h}
      ca:
        certificate: {type: File, file: {path: ca/cert.pem}}
        privateKey: {type: InsecureInline, insecureInline: {value: "-----BEGIN PRIVATE KEY-----"}}
status:
  conditions: []
"#,
    );
    assert_eq!(identity.mesh, "default");
    assert_eq!(identity.labels, labels(&[("team", "web")]));
    assert_eq!(identity.spiffe_id, SpiffeIdTemplates::default());
    assert_eq!(
        identity.provider,
        Some(Provider::Bundled(Bundled {
            mesh_trust_creation: false,
            insecure_allow_self_signed: true,
            expiry: Some(Duration::from_secs(86_400)),
            ca: BundledCa::Provided {
                certificate: DataSource::File("/r/ca/cert.pem".into()),
                private_key: DataSource::InlineString("-----BEGIN PRIVATE KEY-----".into()),
            },
        }))
    );
    let from_env = identity_with_ca(
        "certificate: {type: EnvVar, envVar: {name: CA_CERT}}\n        privateKey: {type: File, file: {path: /k.pem}}",
    );
    let Some(Provider::Bundled(Bundled {
        ca: BundledCa::Provided {
            certificate,
            private_key,
        },
        ..
    })) = from_env.provider
    else {
        panic!("expected a provided CA: {from_env:?}");
    };
    assert_eq!(certificate, DataSource::EnvVar("CA_CERT".into()));
    assert_eq!(private_key, DataSource::File("/k.pem".into()));
}

fn identity_doc(bundled: &str) -> String {
    format!(
        "type: MeshIdentity\nname: i\nmesh: default\nspec:\n  selector: {{dataplane: {{matchLabels: {{}}}}}}\n  provider:\n    type: Bundled\n    bundled:\n      {bundled}\n"
    )
}

fn identity_with_ca(ca: &str) -> MeshIdentity {
    identity(&identity_doc(&format!("ca:\n        {ca}")))
}

#[test]
fn selector_semantics() {
    let all =
        identity("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  selector:\n    dataplane: {}\n");
    assert_eq!(all.selector, Some(Labels::new()));
    assert!(all.matches(&labels(&[("app", "x")])));
    let none = identity("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  selector: {}\n");
    assert_eq!(none.selector, None);
    assert!(!none.matches(&Labels::new()));
    assert!(!none.selects_all());
    let absent = identity("type: MeshIdentity\nname: a\nmesh: m\nspec: {}\n");
    assert_eq!(absent.selector, None);
    assert_eq!(absent.provider, None, "no provider is SPIFFE-ID-only mode");
    let web = identity(
        "type: MeshIdentity\nname: a\nmesh: m\nspec:\n  selector:\n    dataplane:\n      matchLabels: {app: web, tier: front}\n",
    );
    assert!(web.matches(&labels(&[("app", "web"), ("tier", "front"), ("x", "y")])));
    assert!(!web.matches(&labels(&[("app", "web")])));
    assert!(!web.selects_all());
}

#[test]
fn spire_provider_is_recognised() {
    let spire = identity("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  provider:\n    type: Spire\n    spire: {agent: {timeout: 1s}}\n");
    assert_eq!(spire.provider, Some(Provider::Spire));
    let e =
        one_error("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  provider:\n    type: Vault\n");
    assert_error(
        &e,
        "spec.provider.type",
        r#""Vault" must be one of ["Bundled", "Spire", "Extension"]"#,
    );
    assert_eq!(e.resource.as_deref(), Some("MeshIdentity/m/a"));
}

#[test]
fn bundled_needs_exactly_one_ca() {
    let both = errors(&identity_doc(
        "autogenerate: {enabled: true}\n      ca: {certificate: {type: File, file: {path: /c}}}",
    ));
    assert_eq!(both.len(), 2, "{both:#?}");
    assert_error(
        &both[0],
        "spec.provider.bundled.ca",
        "shouldn't be defined once using autogenerated: set either autogenerate.enabled: true or ca, not both",
    );
    assert_error(
        &both[1],
        "spec.provider.bundled.ca.privateKey",
        "required when ca is set",
    );
    let e = one_error(&identity_doc("autogenerate: {enabled: false}"));
    assert_error(&e, "spec.provider.bundled", "no CA");
    let e =
        one_error("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  provider:\n    type: Bundled\n");
    assert_error(&e, "spec.provider.bundled", "required when type is Bundled");
    let e = one_error(&identity_doc(
        "ca:\n        certificate: {type: File, file: {path: /c}}",
    ));
    assert_error(
        &e,
        "spec.provider.bundled.ca.privateKey",
        "required when ca is set",
    );
}

#[test]
fn secure_data_sources_are_checked() {
    let e = one_error(&identity_doc(
        "ca:\n        certificate: {type: Secret, secretRef: {kind: Secret, name: s}}\n        privateKey: {type: File, file: {path: /k}}",
    ));
    assert_error(
        &e,
        "spec.provider.bundled.ca.certificate.type",
        "secret data sources are Kubernetes-only",
    );
    let errors = errors(&identity_doc(
        "ca:\n        certificate: {type: File, envVar: {name: X}}\n        privateKey: {type: EnvVar, envVar: {name: \"\"}}",
    ));
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.provider.bundled.ca.certificate.envVar",
            "spec.provider.bundled.ca.certificate.file",
            "spec.provider.bundled.ca.privateKey.envVar.name",
        ],
        "{errors:#?}"
    );
    assert!(errors[0].message.contains("not allowed when type is File"));
    assert!(errors[1].message.contains("required when type is File"));
    let e = one_error(&identity_doc(
        "ca:\n        certificate: {type: Inline, file: {path: /c}}\n        privateKey: {type: File, file: {path: /k}}",
    ));
    assert_error(
        &e,
        "spec.provider.bundled.ca.certificate.type",
        r#""Inline" must be one of ["File", "EnvVar", "InsecureInline", "Pkcs11", "Secret"]"#,
    );
}

#[test]
fn unknown_spec_fields_and_empty_templates() {
    let e = one_error("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  selectors: {}\n");
    assert_error(&e, "spec.selectors", "unknown field `selectors`");
    let e =
        one_error("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  spiffeID: {trustDomain: \"\"}\n");
    assert_error(&e, "spec.spiffeID.trustDomain", "must not be empty");
    let e = one_error("type: MeshIdentity\nname: a\nmesh: m\n");
    assert_error(&e, "", "missing field `spec`");
    let e = one_error(&identity_doc(
        "autogenerate: {enabled: true}\n      certificateParameters: {expiry: 0s}",
    ));
    assert_error(
        &e,
        "spec.provider.bundled.certificateParameters.expiry",
        "must be greater than zero",
    );
}

#[test]
fn identities_are_grouped_by_mesh() {
    let text = format!(
        "{MESH}type: Mesh\nname: other\n---\ntype: MeshIdentity\nname: b\nmesh: default\nspec: {{}}\n---\ntype: MeshIdentity\nname: a\nmesh: default\nspec: {{}}\n---\ntype: MeshIdentity\nname: a\nmesh: other\nspec: {{}}\n"
    );
    let resources = Resources::from_resources(parse(&text).expect("valid")).expect("consistent");
    let names: Vec<&str> = resources
        .identities_in("default")
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(resources.identities_in("other").count(), 1);
}

#[test]
fn extension_provider_is_recognised_with_its_name() {
    let extension = identity(
        "type: MeshIdentity\nname: a\nmesh: m\nspec:\n  provider:\n    type: Extension\n    extension:\n      name: my-provider\n      config: {endpoint: \"https://ca.example\", retries: 3}\n",
    );
    assert_eq!(
        extension.provider,
        Some(Provider::Extension(Extension {
            name: "my-provider".into()
        }))
    );
    let without_config = identity(
        "type: MeshIdentity\nname: a\nmesh: m\nspec:\n  provider: {type: Extension, extension: {name: x}}\n",
    );
    assert_eq!(
        without_config.provider,
        Some(Provider::Extension(Extension { name: "x".into() }))
    );
}

#[test]
fn extension_provider_needs_a_name_and_an_object_config() {
    let doc = |extension: &str| {
        format!("type: MeshIdentity\nname: a\nmesh: m\nspec:\n  provider:\n    type: Extension\n{extension}")
    };
    let e = one_error(&doc("    extension: {config: {a: 1}}\n"));
    assert_error(&e, "spec.provider.extension.name", "required");
    let e = one_error(&doc("    extension: {name: \" \"}\n"));
    assert_error(&e, "spec.provider.extension.name", "must not be empty");
    let e = one_error(&doc(&format!(
        "    extension: {{name: {}}}\n",
        "x".repeat(300)
    )));
    assert_error(&e, "spec.provider.extension.name", "at most 253 bytes");
    assert!(e.message.len() < 200, "{e}");
    let e = one_error(&doc(""));
    assert_error(
        &e,
        "spec.provider.extension",
        "required when type is Extension",
    );
    let errors = errors(&doc(
        "    extension: {config: [1]}\n    bundled: {autogenerate: {enabled: true}}\n",
    ));
    let found: Vec<(&str, &str)> = errors
        .iter()
        .map(|e| (e.field.as_str(), e.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (
                "spec.provider.bundled",
                "not allowed when type is Extension"
            ),
            (
                "spec.provider.extension.name",
                "required: the name of the extension that issues the identities"
            ),
            (
                "spec.provider.extension.config",
                "must be an object (the extension's own settings)"
            ),
        ]
    );
}

#[test]
fn every_violation_of_a_mesh_identity_is_reported_with_its_field() {
    let errors = errors(
        r#"
type: MeshIdentity
name: web
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
  spiffeID:
    trustDomain: "{{ .Mesh }.mesh.local"
    path: "/ns/{{ .Nope }}"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Test
      certificateParameters: {expiry: 10x}
      autogenerate: {enabled: true}
      ca:
        certificate: {type: File}
        privateKey: {type: Vault, file: {path: /k}}
"#,
    );
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.spiffeID.trustDomain",
            "spec.spiffeID.path",
            "spec.provider.bundled.meshTrustCreation",
            "spec.provider.bundled.certificateParameters.expiry",
            "spec.provider.bundled.ca",
            "spec.provider.bundled.ca.certificate.file",
            "spec.provider.bundled.ca.privateKey.type",
        ],
        "{errors:#?}"
    );
    assert!(
        errors[0].message.contains("unclosed action"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].message.contains("unknown variable .Nope"),
        "{}",
        errors[1]
    );
    assert_eq!(
        errors[2].message,
        r#""Test" must be one of ["Enabled", "Disabled"]"#
    );
    assert!(errors[3].message.contains("unknown unit"), "{}", errors[3]);
    assert!(
        errors[4]
            .message
            .contains("shouldn't be defined once using autogenerated"),
        "{}",
        errors[4]
    );
    assert_eq!(errors[5].message, "required when type is File");
    assert!(errors[6].message.starts_with(r#""Vault" must be one of"#));
    assert!(errors
        .iter()
        .all(|e| e.resource.as_deref() == Some("MeshIdentity/default/web")));

    let e = one_error(
        "type: MeshIdentity\nname: a\nmesh: m\nspec:\n  spiffeID: {trustDomain: '{{ label \"team\" }}.mesh'}\n",
    );
    assert_error(
        &e,
        "spec.spiffeID.trustDomain",
        "may only use {{ .Mesh }} and {{ .Zone }}",
    );
}
