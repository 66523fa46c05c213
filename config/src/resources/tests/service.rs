use super::*;

#[test]
fn valid_mesh_service() {
    let Resource::MeshService(service) = one(r#"
type: MeshService
name: web
mesh: default
labels: {kuma.io/zone: zone-2}
spec:
  selector: {dataplaneTags: {kuma.io/service: web}}
  ports:
    - {port: 80, targetPort: 8080, appProtocol: http, name: http}
    - {port: 81, targetPort: admin}
  identities:
    - {type: ServiceTag, value: web}
    - {type: SpiffeID, value: "spiffe://default.zone-2.mesh.local/workload/web"}
status:
  tls: {status: Ready}
"#)
    else {
        panic!("expected a MeshService");
    };
    assert_eq!(service.zone(), Some("zone-2"));
    assert_eq!(
        service.dataplane_tags,
        Some(Labels::from([(
            "kuma.io/service".to_owned(),
            "web".to_owned()
        )]))
    );
    assert_eq!(
        service.ports,
        [
            ServicePort {
                port: 80,
                target_port: Some(TargetPort::Number(8080)),
                app_protocol: Some("http".into()),
                name: Some("http".into()),
            },
            ServicePort {
                port: 81,
                target_port: Some(TargetPort::Name("admin".into())),
                app_protocol: None,
                name: None,
            },
        ]
    );
    assert_eq!(
        service.identities,
        [
            ServiceIdentity::ServiceTag("web".into()),
            ServiceIdentity::SpiffeId("spiffe://default.zone-2.mesh.local/workload/web".into()),
        ]
    );
}

#[test]
fn identities_are_checked() {
    let errors = errors(
        "type: MeshService\nname: s\nmesh: m\nspec:\n  identities:\n  - {type: SpiffeID, value: default/web}\n  - {type: ServiceTag, value: \"\"}\n",
    );
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(
        &errors[0],
        "spec.identities[0].value",
        "must start with spiffe://",
    );
    assert_error(&errors[1], "spec.identities[1].value", "must not be empty");
    let errors = super::errors(
        "type: MeshService\nname: s\nmesh: m\nspec:\n  identities:\n  - {type: Tag, value: x}\n  - {type: SpiffeID, value: web}\n",
    );
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_error(
        &errors[0],
        "spec.identities[0].type",
        r#""Tag" must be one of ["ServiceTag", "SpiffeID"]"#,
    );
    assert_error(
        &errors[1],
        "spec.identities[1].value",
        "must start with spiffe://",
    );
}

#[test]
fn ports_are_checked() {
    let e = one_error("type: MeshService\nname: s\nmesh: m\nspec:\n  ports:\n  - {port: 0}\n");
    assert_error(&e, "spec.ports[0].port", "must be between 1 and 65535");
    let e = one_error(
        "type: MeshService\nname: s\nmesh: m\nspec:\n  ports:\n  - {port: 1, targetPort: 0}\n",
    );
    assert_error(
        &e,
        "spec.ports[0].targetPort",
        "port must be between 1 and 65535, got 0",
    );
}
