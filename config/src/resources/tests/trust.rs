use super::*;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";

fn trust_doc(bundles: &str) -> String {
    format!("type: MeshTrust\nname: other-domain\nmesh: default\nspec:\n  trustDomain: other.mesh.local\n  caBundles:\n{bundles}")
}

fn pem_bundle(pem: &str) -> String {
    let indented: String = pem.lines().map(|l| format!("          {l}\n")).collect();
    format!("    - type: Pem\n      pem:\n        value: |\n{indented}")
}

#[test]
fn valid_trust() {
    let text = trust_doc(&format!(
        "{}{}",
        pem_bundle(CERT),
        pem_bundle(&CERT.repeat(2))
    ));
    let Resource::MeshTrust(trust) = one(&text) else {
        panic!("expected a MeshTrust");
    };
    assert_eq!(trust.name, "other-domain");
    assert_eq!(trust.mesh, "default");
    assert_eq!(trust.trust_domain.as_str(), "other.mesh.local");
    assert_eq!(trust.ca_bundles, [CERT.to_owned(), CERT.repeat(2)]);
}

#[test]
fn bundles_must_hold_certificates() {
    let key = "-----BEGIN PRIVATE KEY-----\nMIIBAA==\n-----END PRIVATE KEY-----\n";
    let text = trust_doc(&format!(
        "{}{}    - type: Pem\n      pem: {{value: \"just text\"}}\n    - type: Pem\n",
        pem_bundle(CERT),
        pem_bundle(key)
    ));
    let errors = errors(&text);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_error(
        &errors[0],
        "spec.caBundles[1].pem.value",
        "PEM block 1 is labelled PRIVATE KEY: only CERTIFICATE blocks are accepted",
    );
    assert_error(
        &errors[1],
        "spec.caBundles[2].pem.value",
        "no -----BEGIN CERTIFICATE----- block found",
    );
    assert_error(
        &errors[2],
        "spec.caBundles[3].pem",
        "required when type is Pem",
    );
    assert_eq!(
        errors[0].resource.as_deref(),
        Some("MeshTrust/default/other-domain")
    );
}

#[test]
fn trust_needs_domain_and_bundles() {
    let errors =
        errors("type: MeshTrust\nname: t\nmesh: m\nspec:\n  trustDomain: \"\"\n  caBundles: []\n");
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(&errors[0], "spec.trustDomain", "trust domain is missing");
    assert_error(
        &errors[1],
        "spec.caBundles",
        "at least one CA bundle is required",
    );
    let e = one_error("type: MeshTrust\nname: t\nmesh: m\nspec:\n  trustDomain: x\n");
    assert_error(&e, "spec.caBundles", "at least one CA bundle is required");
    let e = one_error(
        "type: MeshTrust\nname: t\nmesh: m\nspec:\n  trustDomain: x\n  caBundles:\n  - type: Der\n",
    );
    assert_error(
        &e,
        "spec.caBundles[0].type",
        r#""Der" must be one of ["Pem"]"#,
    );
}

#[test]
fn every_violation_of_a_mesh_trust_is_reported() {
    let errors = errors(
        "type: MeshTrust\nname: t\nmesh: m\nspec:\n  caBundles:\n  - type: Der\n  - {type: Pem, pem: {value: nope}}\n  - pem: {value: x}\n",
    );
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.trustDomain",
            "spec.caBundles[0].type",
            "spec.caBundles[1].pem.value",
            "spec.caBundles[2].type",
        ],
        "{errors:#?}"
    );
    assert!(errors[0].message.starts_with("required"), "{}", errors[0]);
    assert!(errors[3].message.starts_with("required"), "{}", errors[3]);
}

#[test]
fn trust_domain_syntax_is_checked_when_the_file_is_parsed() {
    for (td, why) in [
        ("Other.Mesh", "uppercase"),
        ("other.mesh:8443", "port"),
        ("spiffe://other.mesh", "':'"),
        ("other mesh", "only a-z"),
    ] {
        let e = one_error(&format!(
            "type: MeshTrust\nname: t\nmesh: m\nspec:\n  trustDomain: \"{td}\"\n  caBundles:\n  - type: Pem\n    pem: {{value: \"-----BEGIN CERTIFICATE-----\\nMIIBAA==\\n-----END CERTIFICATE-----\\n\"}}\n"
        ));
        assert_error(&e, "spec.trustDomain", why);
    }
}

#[test]
fn a_key_pasted_after_a_certificate_is_refused_without_quoting_it() {
    let key =
        "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END EC PRIVATE KEY-----\n";
    let text = trust_doc(&format!(
        "{}{}",
        pem_bundle(CERT),
        pem_bundle(&format!("{CERT}{key}"))
    ));
    let e = one_error(&text);
    assert_error(
        &e,
        "spec.caBundles[1].pem.value",
        "PEM block 2 is labelled EC PRIVATE KEY: only CERTIFICATE blocks are accepted, because everything in a MeshTrust is published to every proxy of the mesh",
    );
    assert!(!e.message.contains("c2VjcmV0"), "{e}");
}
