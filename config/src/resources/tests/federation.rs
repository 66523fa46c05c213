use std::path::PathBuf;

use super::*;

fn relationship(mesh: &str, spec: &str) -> String {
    format!("type: FederationRelationship\nname: partner\nmesh: \"{mesh}\"\nspec:\n{spec}")
}

const SPIFFE_SPEC: &str = "  trustDomain: partner.example\n  bundleEndpoint:\n    url: https://bundles.partner.example:8443/\n    profile: https_spiffe\n    spiffeID: spiffe://partner.example/spire/server\n  initialBundle: {file: partner.json}\n";

#[test]
fn an_https_spiffe_relationship_reads_with_its_files_resolved_beside_it() {
    let Resource::FederationRelationship(r) = one(&relationship("default", SPIFFE_SPEC)) else {
        panic!("expected a FederationRelationship");
    };
    assert_eq!(r.name, "partner");
    assert_eq!(r.mesh, "default");
    assert_eq!(r.trust_domain.as_str(), "partner.example");
    assert_eq!(r.endpoint.url, "https://bundles.partner.example:8443/");
    assert_eq!(
        r.endpoint.profile,
        EndpointProfile::HttpsSpiffe {
            spiffe_id: "spiffe://partner.example/spire/server"
                .parse()
                .expect("valid")
        }
    );
    assert_eq!(r.initial_bundle, Some(PathBuf::from("/r/partner.json")));
    assert!(r.applies_to("default"));
    assert!(!r.applies_to("other"));
}

#[test]
fn an_https_web_relationship_for_every_mesh_needs_no_initial_bundle() {
    let spec = "  trustDomain: partner.example\n  bundleEndpoint: {url: \"https://bundles.partner.example/\", profile: https_web, caFile: /etc/meshca/web-ca.pem}\n";
    let Resource::FederationRelationship(r) = one(&relationship("*", spec)) else {
        panic!("expected a FederationRelationship");
    };
    assert_eq!(r.mesh, EVERY_MESH);
    assert!(r.applies_to("default") && r.applies_to("other"));
    assert_eq!(
        r.endpoint.profile,
        EndpointProfile::HttpsWeb {
            ca_file: Some(PathBuf::from("/etc/meshca/web-ca.pem"))
        }
    );
    assert_eq!(r.initial_bundle, None);
    // Every mesh is no Mesh that must exist.
    let resources = Resources::from_resources(vec![Resource::FederationRelationship(r)])
        .expect("`*` names no Mesh");
    assert_eq!(resources.federation_relationships.len(), 1);
}

#[test]
fn every_missing_or_wrong_field_is_named() {
    let errors = errors(&relationship("default", "  trustDomain: \"not a domain\"\n  bundleEndpoint: {profile: https_spife}\n  initialBundle: {}\n"));
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.trustDomain",
            "spec.initialBundle.file",
            "spec.bundleEndpoint.url",
            "spec.bundleEndpoint.profile"
        ],
        "{errors:#?}"
    );
    assert_error(
        &errors[3],
        "spec.bundleEndpoint.profile",
        "\"https_spife\" must be one of [\"https_spiffe\", \"https_web\"]",
    );
    assert_eq!(
        errors[0].resource.as_deref(),
        Some("FederationRelationship/default/partner")
    );
    let error = one_error(&relationship("default", "  trustDomain: partner.example\n"));
    assert_error(&error, "spec.bundleEndpoint", "required");
}

#[test]
fn https_spiffe_needs_an_initial_bundle_and_an_endpoint_id_of_the_peers_own_domain() {
    let errors = errors(&relationship(
        "default",
        "  trustDomain: partner.example\n  bundleEndpoint: {url: \"https://b/\", profile: https_spiffe, spiffeID: spiffe://other.example/server, caFile: ca.pem}\n",
    ));
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_error(
        &errors[0],
        "spec.bundleEndpoint.caFile",
        "only for profile https_web",
    );
    assert_error(
        &errors[1],
        "spec.initialBundle",
        "required with profile https_spiffe",
    );
    assert_error(
        &errors[2],
        "spec.bundleEndpoint.spiffeID",
        "spiffe://other.example/server is not in trust domain partner.example",
    );
    let error = one_error(&relationship(
        "default",
        "  trustDomain: partner.example\n  bundleEndpoint: {url: \"https://b/\", profile: https_spiffe}\n  initialBundle: {file: b.json}\n",
    ));
    assert_error(
        &error,
        "spec.bundleEndpoint.spiffeID",
        "required with profile https_spiffe",
    );
    let error = one_error(&relationship(
        "default",
        "  trustDomain: partner.example\n  bundleEndpoint: {url: \"https://b/\", profile: https_web, spiffeID: spiffe://partner.example/x}\n",
    ));
    assert_error(
        &error,
        "spec.bundleEndpoint.spiffeID",
        "only for profile https_spiffe",
    );
}

#[test]
fn unknown_fields_and_a_bad_mesh_name_are_refused() {
    let error = one_error(&relationship(
        "default",
        "  trustDomain: partner.example\n  bundleEndpoint: {url: \"https://b/\", profile: https_web}\n  federatesWith: x\n",
    ));
    assert!(error.message.contains("federatesWith"), "{error}");
    let error = one_error(&relationship(
        "**",
        "  trustDomain: partner.example\n  bundleEndpoint: {url: \"https://b/\", profile: https_web}\n",
    ));
    assert_eq!(error.field, "mesh", "{error}");
}

fn checked(text: &str) -> Result<Resources, Vec<ResourceError>> {
    Resources::from_resources(parse(text).expect("each document is valid"))
}

fn web(name: &str, mesh: &str, td: &str, url: &str) -> String {
    format!("type: FederationRelationship\nname: {name}\nmesh: \"{mesh}\"\nspec: {{trustDomain: {td}, bundleEndpoint: {{url: \"{url}\", profile: https_web}}}}\n")
}

#[test]
fn a_trust_domain_has_one_endpoint_and_a_mesh_one_relationship_to_it() {
    let meshes = "type: Mesh\nname: a\n---\ntype: Mesh\nname: b\n---\n";
    // Two meshes trusting one domain through one endpoint, and another domain: fine.
    let fine = format!(
        "{meshes}{}---\n{}---\n{}",
        web("p", "a", "partner.example", "https://x/"),
        web("q", "b", "partner.example", "https://x/"),
        web("r", "a", "other.example", "https://y/"),
    );
    let resources = checked(&fine).expect("consistent");
    assert_eq!(resources.federation_relationships.len(), 3);

    let other_endpoint = format!(
        "{meshes}{}---\n{}",
        web("p", "a", "partner.example", "https://x/"),
        web("q", "b", "partner.example", "https://elsewhere/"),
    );
    let errors = checked(&other_endpoint).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_error(
        &errors[0],
        "spec.bundleEndpoint",
        "FederationRelationship a/p (/r/test.yaml (document 3)) names another bundle endpoint for trust domain partner.example",
    );

    let twice = format!(
        "{meshes}{}---\n{}",
        web("p", "*", "partner.example", "https://x/"),
        web("q", "b", "partner.example", "https://x/"),
    );
    let errors = checked(&twice).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_error(
        &errors[0],
        "mesh",
        "FederationRelationship */p (/r/test.yaml (document 3)) already federates mesh b with trust domain partner.example",
    );
    assert_eq!(
        errors[0].resource.as_deref(),
        Some("FederationRelationship/b/q")
    );

    let errors = checked(&web("p", "c", "partner.example", "https://x/")).unwrap_err();
    assert_error(&errors[0], "mesh", "no Mesh named \"c\"");
}
