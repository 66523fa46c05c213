use super::*;

#[test]
fn valid_dataplane() {
    let Resource::Dataplane(dp) = one(r#"
type: Dataplane
mesh: default
name: web-1
labels: {kuma.io/workload: web, app: web}
networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      tags: {kuma.io/service: web, version: v1}
    - port: 9090
      servicePort: 9091
      tags: {kuma.io/service: web-admin}
    - tags: {kuma.io/service: web}
  outbound:
    - port: 10001
      tags: {kuma.io/service: backend}
  admin: {port: 9901}
"#)
    else {
        panic!("expected a Dataplane");
    };
    assert_eq!(dp.name, "web-1");
    assert_eq!(dp.mesh, "default");
    assert_eq!(
        dp.labels.get("kuma.io/workload").map(String::as_str),
        Some("web")
    );
    assert_eq!(dp.address.as_deref(), Some("10.0.0.1"));
    assert_eq!(dp.inbounds.len(), 3);
    assert_eq!(dp.inbounds[0].port, Some(8080));
    assert_eq!(dp.inbounds[2].port, None);
    assert_eq!(dp.services(), ["web", "web-admin"]);
}

#[test]
fn every_inbound_needs_a_service_tag() {
    let e = one_error(
        "type: Dataplane\nmesh: m\nname: d\nnetworking:\n  inbound:\n  - {port: 1, tags: {kuma.io/service: a}}\n  - {port: 2, tags: {app: b}}\n",
    );
    assert_error(
        &e,
        "networking.inbound[1].tags",
        "every inbound needs a kuma.io/service tag",
    );
    assert_eq!(e.resource.as_deref(), Some("Dataplane/m/d"));
}

#[test]
fn dataplane_field_errors() {
    let e = one_error("type: Dataplane\nmesh: m\nname: d\nnetworking:\n  inbounds: []\n");
    assert_error(&e, "networking.inbounds", "unknown field `inbounds`");
    let e =
        one_error("type: Dataplane\nmesh: m\nname: d\nnetworking:\n  inbound:\n  - port: 70000\n");
    assert_eq!(e.field, "networking.inbound[0].port");
    let e = one_error("type: Dataplane\nmesh: m\nname: d\nlabels: {app: [x]}\n");
    assert_eq!(e.field, "labels.app");
}

#[test]
fn zone_egress() {
    let Resource::ZoneEgress(egress) =
        one("type: ZoneEgress\nname: egress-1\nlabels: {a: b}\nnetworking: {address: 10.0.0.9, port: 10002}\n")
    else {
        panic!("expected a ZoneEgress");
    };
    assert_eq!(egress.name, "egress-1");
    assert_eq!(egress.address.as_deref(), Some("10.0.0.9"));
    assert_eq!(egress.port, Some(10002));
    let Resource::ZoneEgress(bare) = one("type: ZoneEgress\nname: e\n") else {
        panic!("expected a ZoneEgress");
    };
    assert_eq!((bare.address, bare.port), (None, None));
    let e = one_error("type: ZoneEgress\nname: e\nmesh: default\n");
    assert_error(&e, "mesh", "a ZoneEgress belongs to no mesh");
    assert_eq!(e.resource.as_deref(), Some("ZoneEgress/e"));
}
