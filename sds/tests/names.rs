//! Every resource name (docs/architecture.md, "Resource names"), in both validation forms, served exactly as asked.

mod common;

use std::collections::BTreeMap;

use common::*;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, subject_alt_name_matcher::SanType, Secret,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use meshca_auth::ProxyType;
use meshca_control::{ProxyEntry, StreamEvent};
use meshca_sds::{
    describe, tls_certificate_parts, ClientError, SdsClient, SecretKindView,
    DISABLE_SPIFFE_VALIDATION_KEY, SPIFFE_VALIDATOR_NAME,
};
use std::time::Duration;

async fn client(harness: &Harness, mesh: &str, name: &str) -> SdsClient {
    let (token, _) = harness.token_for(mesh, name);
    SdsClient::connect(&harness.unix_target, None, token)
        .await
        .expect("connect")
}

async fn fetch_one(
    client: &mut SdsClient,
    node_id: &str,
    name: &str,
    metadata: Option<Struct>,
) -> Secret {
    let mut secrets = client
        .fetch(node_id, &names(&[name]), metadata)
        .await
        .unwrap_or_else(|error| panic!("fetch {name}: {error}"));
    assert_eq!(secrets.len(), 1);
    let secret = secrets.remove(0);
    assert_eq!(secret.name, name, "the response uses the exact asked name");
    secret
}

fn spiffe_domains(secret: &Secret) -> BTreeMap<String, String> {
    match describe(secret).kind {
        SecretKindView::ValidationContext {
            spiffe_trust_domains: Some(domains),
            trusted_ca_pem: None,
            ..
        } => domains,
        other => panic!(
            "{}: expected the SPIFFE validator form, got {other:?}",
            secret.name
        ),
    }
}

fn plain_ca(secret: &Secret) -> String {
    match describe(secret).kind {
        SecretKindView::ValidationContext {
            trusted_ca_pem: Some(pem),
            spiffe_trust_domains: None,
            ..
        } => pem,
        other => panic!(
            "{}: expected the plain trusted_ca form, got {other:?}",
            secret.name
        ),
    }
}

fn pem_line(pem: &str) -> String {
    pem.trim_end().to_owned()
}

#[tokio::test]
async fn identity_names_serve_the_proxys_own_certificate_and_key() {
    let harness = Harness::start().await;
    let world_snapshot = harness.snapshots.borrow().clone();
    let ProxyEntry::Ready(own) = &world_snapshot.proxies[&web1()] else {
        panic!("web-1 is ready")
    };
    let mut client = client(&harness, "default", "web-1").await;
    for name in [
        "default",
        "spiffe://default.zone/workload/web-1",
        "mi-web",
        "identity_cert:secret:default",
    ] {
        let secret = fetch_one(&mut client, "default.web-1", name, None).await;
        let (chain, key) = tls_certificate_parts(&secret).expect("a tls_certificate");
        assert_eq!(chain, own.chain_pem);
        assert_eq!(key.expose(), own.key.held().expect("held").expose());
        let view = serde_json::to_value(describe(&secret)).expect("serializable");
        assert_eq!(view["tls_certificate"]["private_key"], "[redacted]");
        assert!(!view.to_string().contains("PRIVATE KEY"));
    }
}

#[tokio::test]
async fn trust_names_use_the_spiffe_validator_by_default() {
    let harness = Harness::start().await;
    let world = harness.snapshots.borrow().clone();
    let default_ca = world.meshes["default"].trust.by_trust_domain()["default.zone"][0].clone();
    let mut client = client(&harness, "default", "web-1").await;
    for name in [
        "system_trust_bundle",
        "ROOTCA",
        "system_trust_bundle_default",
    ] {
        let secret = fetch_one(&mut client, "default.web-1", name, None).await;
        let Some(secret::Type::ValidationContext(context)) = &secret.r#type else {
            panic!("{name}: a validation context")
        };
        let validator = context
            .custom_validator_config
            .as_ref()
            .expect("custom validator");
        assert_eq!(validator.name, SPIFFE_VALIDATOR_NAME);
        assert_eq!(
            validator.typed_config.as_ref().expect("typed config").type_url,
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig"
        );
        let domains = spiffe_domains(&secret);
        assert_eq!(domains.keys().collect::<Vec<_>>(), ["default.zone"]);
        assert_eq!(pem_line(&domains["default.zone"]), pem_line(&default_ca));
    }
}

#[tokio::test]
async fn legacy_and_all_names() {
    let harness = Harness::start().await;
    let world = harness.snapshots.borrow().clone();
    let default_ca = world.meshes["default"].trust.by_trust_domain()["default.zone"][0].clone();
    let other_ca = world.meshes["other"].trust.by_trust_domain()["other.zone"][0].clone();
    let egress_ca = world
        .egress
        .as_ref()
        .expect("egress")
        .trust()
        .by_trust_domain()["egress.zone"][0]
        .clone();
    let mut client = client(&harness, "default", "web-1").await;

    let legacy = fetch_one(&mut client, "default.web-1", "mesh_ca:secret:default", None).await;
    assert_eq!(pem_line(&plain_ca(&legacy)), pem_line(&default_ca));

    let all = fetch_one(&mut client, "default.web-1", "ALL", None).await;
    let domains = spiffe_domains(&all);
    assert_eq!(
        domains.keys().collect::<Vec<_>>(),
        ["default.zone", "other.zone"]
    );
    assert_eq!(pem_line(&domains["other.zone"]), pem_line(&other_ca));

    let all_legacy = fetch_one(&mut client, "default.web-1", "mesh_ca:secret:all", None).await;
    let pem = plain_ca(&all_legacy);
    assert!(
        pem.contains(pem_line(&default_ca).as_str()) && pem.contains(pem_line(&other_ca).as_str())
    );

    let egress = fetch_one(
        &mut client,
        "default.web-1",
        "system_trust_bundle_egress",
        None,
    )
    .await;
    assert_eq!(
        pem_line(&spiffe_domains(&egress)["egress.zone"]),
        pem_line(&egress_ca)
    );
    // Only the egress passes: its SPIFFE ID is the one SAN matcher.
    let SecretKindView::ValidationContext {
        subject_alt_names, ..
    } = describe(&egress).kind
    else {
        panic!("a validation context")
    };
    assert_eq!(subject_alt_names, ["spiffe://egress.zone/egress"]);
}

#[tokio::test]
async fn meshservice_context_has_exact_uri_san_matchers() {
    let harness = Harness::start().await;
    let mut client = client(&harness, "default", "web-1").await;
    let secret = fetch_one(&mut client, "default.web-1", "meshservice:web", None).await;
    let Some(secret::Type::ValidationContext(context)) = &secret.r#type else {
        panic!("a validation context")
    };
    assert!(context
        .match_typed_subject_alt_names
        .iter()
        .all(|matcher| matcher.san_type == SanType::Uri as i32));
    let SecretKindView::ValidationContext {
        subject_alt_names,
        spiffe_trust_domains,
        ..
    } = describe(&secret).kind
    else {
        panic!("a validation context")
    };
    assert_eq!(
        subject_alt_names,
        [
            "spiffe://default.zone/workload/web-1",
            "spiffe://default/web"
        ]
    );
    assert!(spiffe_trust_domains.is_some());
}

#[tokio::test]
async fn a_meshservice_without_identities_accepts_nobody() {
    let harness = Harness::start().await;
    let mut client = client(&harness, "default", "web-1").await;
    let secret = fetch_one(&mut client, "default.web-1", "meshservice:idle", None).await;
    let SecretKindView::ValidationContext {
        subject_alt_names, ..
    } = describe(&secret).kind
    else {
        panic!("a validation context")
    };
    // An empty matcher list would let Envoy accept any SAN the mesh's CAs vouch for.
    assert_eq!(subject_alt_names, [meshca_sds::NO_IDENTITY_SAN]);
    assert!(!meshca_sds::NO_IDENTITY_SAN.starts_with("spiffe://"));
}

#[tokio::test]
async fn node_metadata_can_ask_for_plain_trusted_ca() {
    let harness = Harness::start().await;
    let mut client = client(&harness, "default", "web-1").await;
    for flag in [Kind::BoolValue(true), Kind::StringValue("true".into())] {
        let metadata = Struct {
            fields: [(
                DISABLE_SPIFFE_VALIDATION_KEY.to_owned(),
                Value { kind: Some(flag) },
            )]
            .into(),
        };
        for name in ["system_trust_bundle", "ROOTCA", "ALL", "meshservice:web"] {
            let secret =
                fetch_one(&mut client, "default.web-1", name, Some(metadata.clone())).await;
            assert!(!plain_ca(&secret).is_empty(), "{name} in plain form");
        }
    }
    let off = Struct {
        fields: [(
            DISABLE_SPIFFE_VALIDATION_KEY.to_owned(),
            Value {
                kind: Some(Kind::BoolValue(false)),
            },
        )]
        .into(),
    };
    let secret = fetch_one(
        &mut client,
        "default.web-1",
        "system_trust_bundle",
        Some(off),
    )
    .await;
    assert!(!spiffe_domains(&secret).is_empty());
}

#[tokio::test]
async fn other_mesh_trust_only_for_zone_egress() {
    let harness = Harness::start().await;
    let mut sidecar = client(&harness, "default", "web-1").await;
    for name in [
        "system_trust_bundle_other",
        "mesh_ca:secret:other",
        "identity_cert:secret:other",
    ] {
        let error = sidecar
            .fetch("default.web-1", &names(&[name]), None)
            .await
            .expect_err("a sidecar may not fetch another mesh's names");
        assert!(
            matches!(&error, ClientError::Status { code: tonic::Code::NotFound, message } if message.contains(name)),
            "{name}: {error}"
        );
    }
    let (token, _) = harness.token_with(
        "default",
        "egress",
        ProxyType::ZoneEgress,
        now_unix(),
        Duration::from_secs(600),
    );
    let mut egress = SdsClient::connect(&harness.unix_target, None, token)
        .await
        .expect("connect");
    let secret = fetch_one(
        &mut egress,
        "default.egress",
        "system_trust_bundle_other",
        None,
    )
    .await;
    assert_eq!(
        spiffe_domains(&secret).keys().collect::<Vec<_>>(),
        ["other.zone"]
    );
}

#[tokio::test]
async fn fetch_errors_name_the_resource() {
    let harness = Harness::start().await;
    let mut client = client(&harness, "default", "web-1").await;
    let error = client
        .fetch(
            "default.web-1",
            &names(&["default", "no-such-secret"]),
            None,
        )
        .await
        .expect_err("unknown name");
    assert!(
        matches!(&error, ClientError::Status { code: tonic::Code::NotFound, message } if message.contains("no-such-secret")),
        "{error}"
    );
    let error = client
        .fetch("default.web-1", &[], None)
        .await
        .expect_err("empty");
    assert!(
        matches!(
            error,
            ClientError::Status {
                code: tonic::Code::InvalidArgument,
                ..
            }
        ),
        "{error}"
    );
    let error = client
        .fetch("default.web-1", &names(&["meshservice:nope"]), None)
        .await
        .expect_err("unknown MeshService");
    assert!(
        matches!(
            error,
            ClientError::Status {
                code: tonic::Code::NotFound,
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_proxy_never_gets_another_proxys_key() {
    let harness = Harness::start().await;
    let world = harness.snapshots.borrow().clone();
    let ProxyEntry::Ready(web2) =
        &world.proxies[&meshca_control::ProxyKey::new("default", "web-2")]
    else {
        panic!("web-2 ready")
    };
    let mut client = client(&harness, "default", "web-1").await;
    // web-2's SPIFFE ID and MeshIdentity name are not web-1's names.
    for name in [
        "spiffe://default.zone/workload/web-2",
        "mi-web-2",
        "identity_cert:secret:other",
    ] {
        let error = client
            .fetch("default.web-1", &names(&[name]), None)
            .await
            .expect_err("not web-1's resource");
        assert!(
            matches!(
                error,
                ClientError::Status {
                    code: tonic::Code::NotFound,
                    ..
                }
            ),
            "{name}: {error}"
        );
    }
    // Asking as web-2 with web-1's token is refused outright.
    let error = client
        .fetch("default.web-2", &names(&["default"]), None)
        .await
        .expect_err("node id of another proxy");
    assert!(
        matches!(
            error,
            ClientError::Status {
                code: tonic::Code::PermissionDenied,
                ..
            }
        ),
        "{error}"
    );
    // And on a stream, what web-1 gets never contains web-2's key.
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request(
            "default.web-1",
            &[
                "default",
                "spiffe://default.zone/workload/web-2",
                "mi-web-2",
            ],
        ),
    )
    .await
    .expect("stream");
    let response = stream.expect_response().await;
    let served = secrets(&response);
    assert_eq!(served.keys().collect::<Vec<_>>(), ["default"]);
    let key = web2.key.held().expect("held").expose().as_bytes();
    for resource in &response.resources {
        assert!(!resource
            .value
            .windows(key.len())
            .any(|window| window == key));
    }
}

#[tokio::test]
async fn no_identity_serves_trust_but_not_identity() {
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot.proxies.insert(
        web1(),
        ProxyEntry::NoIdentity {
            reason: "template {{ .Namespace }} did not render".into(),
        },
    );
    let harness = Harness::start_with(Default::default(), snapshot).await;
    let mut client = client(&harness, "default", "web-1").await;
    let error = client
        .fetch("default.web-1", &names(&["default"]), None)
        .await
        .expect_err("no identity");
    assert!(
        matches!(&error, ClientError::Status { code: tonic::Code::NotFound, message } if message.contains("did not render")),
        "{error}"
    );
    fetch_one(&mut client, "default.web-1", "system_trust_bundle", None).await;

    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Sotw::open(
        harness.tls_channel().await,
        Some(&token),
        first_request(
            "default.web-1",
            &["default", "ROOTCA", "system_trust_bundle"],
        ),
    )
    .await
    .expect("stream");
    let response = stream.expect_response().await;
    // Exactly the available asked resources, each under the asked name, in order.
    let served: Vec<String> = response
        .resources
        .iter()
        .map(|any| decode_any(any).name)
        .collect();
    assert_eq!(served, ["ROOTCA", "system_trust_bundle"]);
}

#[tokio::test]
async fn a_fetch_reports_its_end_so_the_proxy_does_not_stay_connected() {
    let mut harness = Harness::start().await;
    let mut client = client(&harness, "default", "web-1").await;
    fetch_one(&mut client, "default.web-1", "default", None).await;
    let connected = harness
        .event(|event| match event {
            StreamEvent::Connected { stream, .. } => Some(stream),
            _ => None,
        })
        .await;
    let ended = harness
        .event(|event| match event {
            StreamEvent::Disconnected { stream } => Some(stream),
            _ => None,
        })
        .await;
    assert_eq!(ended, connected);
    assert!(
        harness.server.registry().is_empty(),
        "fetches are not streams"
    );
}
