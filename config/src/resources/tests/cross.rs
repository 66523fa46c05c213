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

const MESHES: &str = "type: Mesh\nname: default\n---\ntype: Mesh\nname: other\n---\ntype: Dataplane\nname: billing-1\nmesh: default\n---\ntype: Dataplane\nname: web-1\nmesh: other\n";

fn registration(name: &str, spec: &str) -> String {
    format!("---\ntype: WorkloadRegistration\nmesh: default\nname: {name}\nspec: {spec}\n")
}

#[test]
fn registrations_are_grouped_sorted_and_looked_up() {
    let resources = checked(&format!(
        "{MESHES}{}{}---\ntype: WorkloadRegistration\nmesh: other\nname: a\nspec: {{dataplane: web-1, selectors: [unix:uid:3]}}\n",
        registration("z", "{dataplane: billing-1, selectors: [unix:uid:1], hint: h}"),
        registration("b", "{dataplane: billing-1, selectors: [unix:uid:2], hint: h}"),
    ))
    .expect("consistent");
    let names: Vec<(&str, &str)> = resources
        .workload_registrations
        .iter()
        .map(|r| (r.mesh.as_str(), r.name.as_str()))
        .collect();
    assert_eq!(names, [("default", "b"), ("default", "z"), ("other", "a")]);
    let in_default: Vec<&str> = resources
        .registrations_in("default")
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(in_default, ["b", "z"]);
    assert_eq!(
        resources
            .registration("other", "a")
            .map(|r| r.dataplane.as_str()),
        Some("web-1")
    );
    assert!(resources.registration("default", "a").is_none());
    let only_registrations = Resources {
        workload_registrations: resources.workload_registrations.clone(),
        ..Resources::default()
    };
    assert!(!only_registrations.is_empty());
}

#[test]
fn registration_cross_checks_report_every_error() {
    let errors = checked(&format!(
        "{MESHES}{}{}{}{}{}{}---\ntype: WorkloadRegistration\nmesh: nowhere\nname: lost\nspec: {{dataplane: billing-1, selectors: [unix:uid:1]}}\n",
        // A Dataplane that does not exist, and one of another mesh.
        registration("missing", "{dataplane: billing-2, selectors: [unix:uid:1]}"),
        registration("elsewhere", "{dataplane: web-1, selectors: [unix:uid:1]}"),
        // The same hint with the same selector set (in another order): the later one is refused.
        registration("first", "{dataplane: billing-1, selectors: [unix:uid:1, unix:gid:2], hint: billing}"),
        registration("second", "{dataplane: billing-1, selectors: [unix:gid:2, unix:uid:1], hint: billing}"),
        // Not a hint clash (other agent), but the Dataplane's other registrations are served on the
        // server's own socket.
        registration("on-agent", "{dataplane: billing-1, selectors: [unix:uid:1, unix:gid:2], hint: billing, agent: host-1}"),
        registration("more", "{dataplane: billing-1, selectors: [unix:uid:1, unix:gid:2, unix:gid:3], hint: billing}"),
    ))
    .unwrap_err();
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        [
            "/r/test.yaml: WorkloadRegistration/nowhere/lost: mesh: no Mesh named \"nowhere\" (defined: default, other)",
            "/r/test.yaml: WorkloadRegistration/default/missing: spec.dataplane: Dataplane \"billing-2\" does not exist in mesh \"default\"",
            "/r/test.yaml: WorkloadRegistration/default/elsewhere: spec.dataplane: Dataplane \"web-1\" does not exist in mesh \"default\"",
            "/r/test.yaml: WorkloadRegistration/default/second: spec.hint: hint \"billing\" is already used by registration \"first\" (/r/test.yaml (document 7)) with the same selectors on the server's own socket: a caller matching both would get two SVIDs with one hint",
            "/r/test.yaml: WorkloadRegistration/default/on-agent: spec.agent: Dataplane \"billing-1\" is served by agent \"host-1\" here but on the server's own socket by registration \"first\" (/r/test.yaml (document 7)): every registration of a Dataplane must be served at the same place, where its key is held",
            "/r/test.yaml: WorkloadRegistration/nowhere/lost: spec.dataplane: Dataplane \"billing-1\" does not exist in mesh \"nowhere\"",
        ]
    );
}

#[test]
fn same_hint_on_the_same_agent_clashes() {
    let errors = checked(&format!(
        "{MESHES}{}{}",
        registration(
            "a",
            "{dataplane: billing-1, selectors: [unix:uid:1], hint: h, agent: host-1}"
        ),
        registration(
            "b",
            "{dataplane: billing-1, selectors: [unix:uid:1], hint: h, agent: host-1}"
        ),
    ))
    .unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_error(
        &errors[0],
        "spec.hint",
        "already used by registration \"a\" (/r/test.yaml (document 5)) with the same selectors on agent \"host-1\"",
    );
    assert_eq!(
        errors[0].resource.as_deref(),
        Some("WorkloadRegistration/default/b")
    );
}

#[test]
fn a_dataplane_is_served_by_one_agent_or_by_the_server() {
    // Two registrations on one agent, or two on the server's own socket: fine.
    checked(&format!(
        "{MESHES}{}{}---\ntype: WorkloadRegistration\nmesh: other\nname: a\nspec: {{dataplane: web-1, selectors: [unix:uid:3]}}\n---\ntype: WorkloadRegistration\nmesh: other\nname: b\nspec: {{dataplane: web-1, selectors: [unix:uid:4]}}\n",
        registration("a", "{dataplane: billing-1, selectors: [unix:uid:1], agent: host-1}"),
        registration("b", "{dataplane: billing-1, selectors: [unix:uid:2], agent: host-1}"),
    ))
    .expect("one place per Dataplane");
    // Two agents: the later registration is refused, naming the agent field.
    let errors = checked(&format!(
        "{MESHES}{}{}",
        registration(
            "a",
            "{dataplane: billing-1, selectors: [unix:uid:1], agent: host-1}"
        ),
        registration(
            "b",
            "{dataplane: billing-1, selectors: [unix:uid:2], agent: host-2}"
        ),
    ))
    .unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        "/r/test.yaml: WorkloadRegistration/default/b: spec.agent: Dataplane \"billing-1\" is served by agent \"host-2\" here but by agent \"host-1\" by registration \"a\" (/r/test.yaml (document 5)): every registration of a Dataplane must be served at the same place, where its key is held"
    );
    // One on an agent, one on the server's socket (either order).
    for (first, second) in [("agent: host-1", ""), ("", "agent: host-1")] {
        let errors = checked(&format!(
            "{MESHES}{}{}",
            registration(
                "a",
                &format!("{{dataplane: billing-1, selectors: [unix:uid:1], {first}}}")
            ),
            registration(
                "b",
                &format!("{{dataplane: billing-1, selectors: [unix:uid:2], {second}}}")
            ),
        ))
        .unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert_error(&errors[0], "spec.agent", "the server's own socket");
        assert_eq!(
            errors[0].resource.as_deref(),
            Some("WorkloadRegistration/default/b")
        );
    }
}

#[test]
fn a_broken_dataplane_is_not_reported_missing_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("r.yaml"),
        format!(
            "type: Mesh\nname: default\n---\ntype: Dataplane\nname: billing-1\nmesh: default\nnetworking: {{inbound: [{{port: 1}}]}}\n{}",
            registration("r", "{dataplane: billing-1, selectors: [unix:uid:1]}")
        ),
    )
    .expect("write");
    let errors = load_dir(dir.path(), &LoadLimits::default()).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].resource.as_deref(),
        Some("Dataplane/default/billing-1")
    );
}

#[test]
fn dataplane_changes_name_the_dataplanes_a_change_reaches() {
    let base = "type: Mesh\nname: m\n---\ntype: Dataplane\nname: a\nmesh: m\n---\ntype: Dataplane\nname: b\nmesh: m\nlabels: {team: x}\n";
    let registration = "---\ntype: WorkloadRegistration\nmesh: m\nname: r\nspec: {dataplane: a, selectors: [unix:uid:1001]}\n";
    let old = checked(base).expect("consistent");
    let names = |changes: Option<BTreeSet<(String, String)>>| {
        changes.map(|set| {
            set.into_iter()
                .map(|(m, n)| format!("{m}/{n}"))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(names(old.dataplane_changes(&old)), Some(vec![]));
    // A Dataplane added, changed, removed.
    let added = checked(&format!("{base}---\ntype: Dataplane\nname: c\nmesh: m\n")).unwrap();
    assert_eq!(
        names(old.dataplane_changes(&added)),
        Some(vec!["m/c".into()])
    );
    assert_eq!(
        names(added.dataplane_changes(&old)),
        Some(vec!["m/c".into()])
    );
    let relabelled = checked(&base.replace("team: x", "team: y")).unwrap();
    assert_eq!(
        names(old.dataplane_changes(&relabelled)),
        Some(vec!["m/b".into()])
    );
    // A registration names its Dataplane, not itself.
    let registered = checked(&format!("{base}{registration}")).unwrap();
    assert_eq!(
        names(old.dataplane_changes(&registered)),
        Some(vec!["m/a".into()])
    );
    let moved = checked(&format!(
        "{base}{}",
        registration.replace("dataplane: a", "dataplane: b")
    ))
    .unwrap();
    assert_eq!(
        names(registered.dataplane_changes(&moved)),
        Some(vec!["m/a".into(), "m/b".into()])
    );
    // Anything else may reach every dataplane.
    let service = checked(&format!(
        "{base}---\ntype: MeshService\nname: s\nmesh: m\nspec: {{}}\n"
    ))
    .unwrap();
    assert_eq!(old.dataplane_changes(&service), None);
    let mesh = checked(&base.replace(
        "name: m\n---",
        "name: m\nmtls: {enabledBackend: ca-1, backends: [{name: ca-1, type: builtin}]}\n---",
    ))
    .unwrap();
    assert_eq!(old.dataplane_changes(&mesh), None);
}
