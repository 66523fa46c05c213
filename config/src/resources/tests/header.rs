use super::*;

#[test]
fn multi_document_file_with_empty_documents() {
    let text = r#"
# a comment before the first `---` belongs to the first document
---
type: Mesh
name: default
---
---
type: MeshIdentity
name: identity
mesh: default
spec: {}
---
type: Dataplane
name: web-1
mesh: default
"#;
    let resources = parse(text).expect("valid");
    let summary: Vec<(String, usize)> = resources
        .iter()
        .map(|r| (r.id(), r.source().document))
        .collect();
    assert_eq!(
        summary,
        [
            ("Mesh/default".to_owned(), 1),
            ("MeshIdentity/default/identity".to_owned(), 3),
            ("Dataplane/default/web-1".to_owned(), 4),
        ]
    );
    assert_eq!(parse("").expect("empty file"), []);
    assert_eq!(parse("# only a comment\n").expect("comment-only file"), []);
}

#[test]
fn errors_in_one_document_do_not_hide_others() {
    let errors = errors(
        "type: Mesh\nname: a\nmtls: {enabledBackends: x}\n---\ntype: Mesh\nname: ok\n---\ntype: MeshTrust\nname: t\nmesh: a\nspec: {trustDomain: x}\n",
    );
    let located: Vec<(usize, &str)> = errors
        .iter()
        .map(|e| (e.document, e.field.as_str()))
        .collect();
    assert_eq!(
        located,
        [(1, "mtls.enabledBackends"), (3, "spec.caBundles")]
    );
}

#[test]
fn type_is_required_and_checked() {
    let e = one_error("name: x\n");
    assert_error(
        &e,
        "type",
        "required; one of Mesh, MeshIdentity, MeshTrust, Dataplane, ZoneEgress, MeshService, WorkloadRegistration, FederationRelationship, Secret",
    );
    assert_eq!(e.resource, None);
    assert_eq!(e.to_string(), "/r/test.yaml: document 1: type: required; one of Mesh, MeshIdentity, MeshTrust, Dataplane, ZoneEgress, MeshService, WorkloadRegistration, FederationRelationship, Secret");
    let e = one_error("type: MeshIdentiy\nname: x\nmesh: m\n");
    assert_error(
        &e,
        "type",
        "unknown resource type \"MeshIdentiy\"; meshca reads Mesh, MeshIdentity",
    );
    let e = one_error("type: [Mesh]\nname: x\n");
    assert_error(&e, "type", "must be a string");
}

#[test]
fn kuma_types_meshca_does_not_use_are_skipped() {
    let resources = parse(
        "type: MeshTrafficPermission\nname: allow-all\nmesh: default\nspec: {targetRef: {kind: Mesh}}\n---\ntype: Mesh\nname: default\n",
    )
    .expect("valid");
    assert_eq!(resources.len(), 1);
    assert_eq!(resources[0].kind(), ResourceType::Mesh);
}

#[test]
fn names_are_required_and_valid() {
    let e = one_error("type: Mesh\n");
    assert_error(&e, "name", "required");
    let e = one_error("type: Mesh\nname: Default_Mesh\n");
    assert_error(&e, "name", "\"Default_Mesh\" is not a valid name");
    assert_eq!(e.resource.as_deref(), Some("Mesh/Default_Mesh"));
    let long = "a".repeat(254);
    let e = one_error(&format!("type: Mesh\nname: {long}\n"));
    assert_error(&e, "name", "254 bytes long; at most 253");
    let e = one_error("type: Dataplane\nname: d\n");
    assert_error(
        &e,
        "mesh",
        "required: the name of the Mesh this Dataplane belongs to",
    );
    let e = one_error("type: Dataplane\nname: d\nmesh: Bad!\n");
    assert_error(&e, "mesh", "is not a valid name");
}

#[test]
fn documents_must_be_mappings() {
    let e = one_error("- type: Mesh\n");
    assert_error(
        &e,
        "",
        "expected a resource: a mapping with type, name and its fields",
    );
    assert_eq!(
        e.to_string(),
        "/r/test.yaml: document 1: expected a resource: a mapping with type, name and its fields"
    );
}

#[test]
fn syntax_errors_carry_the_line_and_keep_earlier_errors() {
    let errors = errors("type: Mesh\nname: Bad\n---\ntype: Mesh\nname: [unclosed\n");
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!(errors[0].field, "name");
    assert_eq!(errors[1].document, 2);
    assert!(
        errors[1].message.starts_with("YAML syntax error"),
        "{}",
        errors[1]
    );
    assert!(errors[1].message.contains("line 6"), "{}", errors[1]);
}

#[test]
fn duplicate_keys_are_errors() {
    let e = one_error("type: Mesh\nname: a\nname: b\n");
    assert!(e.message.contains("duplicate"), "{e}");
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    const VALID: &str = "type: Mesh\nname: default\nmtls:\n  enabledBackend: a\n  backends:\n  - name: a\n    type: provided\n    conf:\n      cert: {inline: \"aGVsbG8=\"}\n      key: {file: k.pem}\n---\ntype: MeshIdentity\nname: i\nmesh: default\nspec:\n  selector: {dataplane: {matchLabels: {}}}\n  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}\n";

    proptest! {
        #[test]
        fn on_arbitrary_text(text in "\\PC{0,300}") {
            let _ = parse(&text);
        }

        #[test]
        fn on_truncated_or_corrupted_documents(cut in 0..VALID.len(), byte in 0u8..128) {
            let mut bytes = VALID.as_bytes().to_vec();
            bytes.truncate(cut);
            let truncated = String::from_utf8_lossy(&bytes).into_owned();
            let _ = parse(&truncated);
            let mut corrupted = VALID.as_bytes().to_vec();
            corrupted[cut] = byte;
            let _ = parse(&String::from_utf8_lossy(&corrupted));
        }
    }

    #[test]
    fn the_seed_document_is_valid() {
        assert_eq!(parse(VALID).map(|r| r.len()), Ok(2));
    }
}
