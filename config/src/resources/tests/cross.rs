use super::*;

fn checked(text: &str) -> Result<Resources, Vec<ResourceError>> {
    Resources::from_resources(parse(text).expect("each document is valid"))
}

#[test]
fn duplicates_are_reported_with_the_first_definition() {
    let errors = checked(
        "type: Mesh\nname: m\n---\ntype: Mesh\nname: m\n---\ntype: Dataplane\nname: d\nmesh: m\n---\ntype: Dataplane\nname: d\nmesh: m\n---\ntype: MeshService\nname: d\nmesh: m\nspec: {}\n",
    )
    .unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        "/r/test.yaml: Mesh/m: name: duplicate: a Mesh named \"m\" is already defined in /r/test.yaml (document 1)"
    );
    assert_eq!(errors[1].document, 4);
    assert_error(
        &errors[1],
        "name",
        "a Dataplane named \"d\" in mesh \"m\" is already defined in /r/test.yaml (document 3)",
    );
}

#[test]
fn same_name_in_different_meshes_is_fine() {
    let resources = checked(
        "type: Mesh\nname: a\n---\ntype: Mesh\nname: b\n---\ntype: Dataplane\nname: d\nmesh: a\n---\ntype: Dataplane\nname: d\nmesh: b\n",
    )
    .expect("consistent");
    assert!(resources.dataplane("a", "d").is_some());
    assert!(resources.dataplane("b", "d").is_some());
    assert!(resources.dataplane("c", "d").is_none());
}

#[test]
fn mesh_references_must_resolve() {
    let errors = checked(
        "type: Mesh\nname: default\n---\ntype: MeshIdentity\nname: i\nmesh: x\nspec: {}\n---\ntype: MeshTrust\nname: t\nmesh: y\nspec: {trustDomain: t, caBundles: [{type: Pem, pem: {value: \"-----BEGIN CERTIFICATE-----\\nMIIBAA==\\n-----END CERTIFICATE-----\\n\"}}]}\n---\ntype: Dataplane\nname: d\nmesh: x\n---\ntype: MeshService\nname: s\nmesh: x\nspec: {}\n---\ntype: ZoneEgress\nname: e\n",
    )
    .unwrap_err();
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        [
            "/r/test.yaml: MeshIdentity/x/i: mesh: no Mesh named \"x\" (defined: default)",
            "/r/test.yaml: MeshTrust/y/t: mesh: no Mesh named \"y\" (defined: default)",
            "/r/test.yaml: Dataplane/x/d: mesh: no Mesh named \"x\" (defined: default)",
            "/r/test.yaml: MeshService/x/s: mesh: no Mesh named \"x\" (defined: default)",
        ]
    );
}

#[test]
fn grouped_and_sorted() {
    let resources = checked(
        "type: ZoneEgress\nname: z2\n---\ntype: ZoneEgress\nname: z1\n---\ntype: Mesh\nname: b\n---\ntype: Mesh\nname: a\n---\ntype: MeshService\nname: s2\nmesh: b\nspec: {}\n---\ntype: MeshService\nname: s1\nmesh: b\nspec: {}\n---\ntype: MeshService\nname: s3\nmesh: a\nspec: {}\n",
    )
    .expect("consistent");
    assert_eq!(resources.meshes.keys().collect::<Vec<_>>(), ["a", "b"]);
    let egress: Vec<&str> = resources
        .zone_egresses
        .iter()
        .map(|z| z.name.as_str())
        .collect();
    assert_eq!(egress, ["z1", "z2"]);
    let services: Vec<(&str, &str)> = resources
        .mesh_services
        .iter()
        .map(|s| (s.mesh.as_str(), s.name.as_str()))
        .collect();
    assert_eq!(services, [("a", "s3"), ("b", "s1"), ("b", "s2")]);
    assert_eq!(resources.services_in("b").count(), 2);
    assert!(resources.service("a", "s3").is_some());
    assert!(resources.zone_egress("z1").is_some());
    assert!(!resources.is_empty());
    assert!(Resources::default().is_empty());
}
