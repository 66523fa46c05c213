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
        "unknown variant `Vault`, expected `Bundled` or `Spire`",
    );
    assert_eq!(e.resource.as_deref(), Some("MeshIdentity/m/a"));
}

#[test]
fn bundled_needs_exactly_one_ca() {
    let e = one_error(&identity_doc(
        "autogenerate: {enabled: true}\n      ca: {certificate: {type: File, file: {path: /c}}}",
    ));
    assert_error(
        &e,
        "spec.provider.bundled",
        "set either autogenerate.enabled: true or ca, not both",
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
        "unknown variant `Inline`",
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
