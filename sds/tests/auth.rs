//! Authentication and authorization: every failure gets the right code and no secret.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use meshca_auth::{Claims, ProxyType, RevocationList, SigningKey};
use meshca_sds::SECRET_TYPE_URL;
use meshca_serve::StreamMetrics;
use tonic::{Code, Status};

/// Opens a stream and returns the status that ends it; fails if any response arrives.
async fn refused_stream(harness: &Harness, token: Option<&str>, first: DiscoveryRequest) -> Status {
    match Sotw::open(harness.unix_channel().await, token, first).await {
        Err(status) => status,
        Ok(mut stream) => match stream.recv().await {
            Ok(response) => panic!("a response leaked: {} resources", response.resources.len()),
            Err(status) => status,
        },
    }
}

async fn refused_fetch(harness: &Harness, token: Option<&str>, node_id: &str) -> Status {
    let request = first_request(node_id, &["default"]);
    let request = match token {
        Some(token) => authorized(request, token),
        None => tonic::Request::new(request),
    };
    SecretDiscoveryServiceClient::new(harness.unix_channel().await)
        .fetch_secrets(request)
        .await
        .expect_err("refused")
}

#[tokio::test]
async fn missing_or_garbage_tokens_are_unauthenticated() {
    let harness = Harness::start().await;
    let other_key = SigningKey::generate().expect("key").0;
    let foreign_claims = Claims::new_dataplane(
        "default",
        "web-1",
        Default::default(),
        Default::default(),
        Duration::from_secs(600),
        now_unix(),
    )
    .expect("claims");
    let foreign = other_key.mint(&foreign_claims).expect("mint");
    for token in [None, Some("garbage"), Some("a.b.c"), Some(foreign.as_str())] {
        let status = refused_stream(
            &harness,
            token,
            first_request("default.web-1", &["default"]),
        )
        .await;
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{token:?}: {status:?}"
        );
        let status = refused_fetch(&harness, token, "default.web-1").await;
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{token:?}: {status:?}"
        );
    }
    assert_eq!(
        StreamMetrics::get(&harness.server.metrics().auth_failures),
        8
    );
}

#[tokio::test]
async fn wrong_header_shape_is_unauthenticated() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut request = tonic::Request::new(first_request("default.web-1", &["default"]));
    request
        .metadata_mut()
        .insert("authorization", token.parse().expect("ascii"));
    let status = SecretDiscoveryServiceClient::new(harness.unix_channel().await)
        .fetch_secrets(request)
        .await
        .expect_err("no Bearer prefix");
    assert_eq!(status.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn expired_token_is_unauthenticated() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_with(
        "default",
        "web-1",
        ProxyType::Dataplane,
        now_unix() - 7200,
        Duration::from_secs(3600),
    );
    let status = refused_stream(
        &harness,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await;
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(status.message().contains("expired"), "{status:?}");
}

#[tokio::test]
async fn revoked_token_is_refused_and_closes_open_streams() {
    let harness = Harness::start().await;
    let (token, claims) = harness.token_for("default", "web-1");
    let (other_token, _) = harness.token_for("default", "web-2");
    let mut stream = Sotw::open(
        harness.tls_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("stream");
    stream.expect_response().await;
    let mut bystander = Sotw::open(
        harness.tls_channel().await,
        Some(&other_token),
        first_request("default.web-2", &["default"]),
    )
    .await
    .expect("stream");
    bystander.expect_response().await;

    let revoked = RevocationList::parse(&claims.id).expect("revocation list");
    harness.revocations.send_replace(Arc::new(revoked));
    let status = stream.recv().await.expect_err("closed");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"));

    // New connections with that token are refused; the other proxy keeps its stream.
    let status = refused_fetch(&harness, Some(&token), "default.web-1").await;
    assert_eq!(status.code(), Code::Unauthenticated);
    bystander
        .send(DiscoveryRequest {
            resource_names: names(&["default", "ROOTCA"]),
            type_url: SECRET_TYPE_URL.into(),
            ..Default::default()
        })
        .await;
    assert_eq!(bystander.expect_response().await.resources.len(), 2);
}

#[tokio::test]
async fn node_id_must_match_the_token() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-1");
    for node_id in ["default.web-2", "other.web-1", "default"] {
        let status =
            refused_stream(&harness, Some(&token), first_request(node_id, &["default"])).await;
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "{node_id}: {status:?}"
        );
        let status = refused_fetch(&harness, Some(&token), node_id).await;
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "{node_id}: {status:?}"
        );
    }
    // Without a node the first request is invalid.
    let mut first = first_request("x", &["default"]);
    first.node = None;
    let status = refused_stream(&harness, Some(&token), first).await;
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn node_id_may_not_change_on_a_stream() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("stream");
    let response = stream.expect_response().await;
    // Omitting the node later is fine (an ACK)...
    stream.ack(&response, &names(&["default"])).await;
    // ...naming another node is not.
    stream
        .send(DiscoveryRequest {
            node: node("default.web-2"),
            resource_names: names(&["default", "ROOTCA"]),
            type_url: SECRET_TYPE_URL.into(),
            response_nonce: response.nonce.clone(),
            version_info: response.version_info.clone(),
            ..Default::default()
        })
        .await;
    let status = stream.recv().await.expect_err("closed");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

#[tokio::test]
async fn delta_streams_are_authenticated_too() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-2");
    let first = DeltaDiscoveryRequest {
        node: node("default.web-1"),
        type_url: SECRET_TYPE_URL.into(),
        resource_names_subscribe: names(&["default"]),
        ..Default::default()
    };
    let status = match Delta::open(harness.unix_channel().await, &token, first).await {
        Err(status) => status,
        Ok(mut stream) => stream.recv().await.expect_err("refused"),
    };
    assert_eq!(status.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn a_token_contradicting_the_proxy_claim_rule_gets_nothing() {
    use meshca_control::ClaimRule;
    use std::collections::BTreeMap;
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot.claim_rules.insert(
        web1(),
        std::sync::Arc::new(ClaimRule {
            labels: Arc::new(meshca_auth::LabelMap::from([(
                "app".to_owned(),
                "web".to_owned(),
            )])),
            services: vec!["web".to_owned()],
        }),
    );
    let harness = Harness::start_with(meshca_serve::HubOptions::default(), snapshot).await;
    let labels = BTreeMap::from([("app".to_owned(), "db".to_owned())]);
    let claims = Claims::new_dataplane(
        "default",
        "web-1",
        labels,
        BTreeMap::new(),
        Duration::from_secs(3600),
        now_unix(),
    )
    .expect("valid claims");
    let token = harness.signing.mint(&claims).expect("mint");
    let mut client = meshca_sds::SdsClient::connect(&harness.unix_target, None, token)
        .await
        .expect("connect");
    let error = client
        .fetch("default.web-1", &["default".to_owned()], None)
        .await
        .expect_err("a contradicting token must not receive web-1's identity");
    assert!(
        error.to_string().contains("app=db"),
        "the refusal says why: {error}"
    );
}

#[tokio::test]
async fn an_open_stream_is_closed_when_its_claim_rule_changes_to_contradict_its_token() {
    use meshca_control::{Changed, ClaimRule};
    use std::collections::BTreeMap;
    let rule = |app: &str| {
        Arc::new(ClaimRule {
            labels: Arc::new(meshca_auth::LabelMap::from([(
                "app".to_owned(),
                app.to_owned(),
            )])),
            services: vec!["web".to_owned()],
        })
    };
    let world = World::new();
    let mut first = world.snapshot(1);
    first.claim_rules.insert(web1(), rule("web"));
    let harness = Harness::start_with(meshca_serve::HubOptions::default(), first.clone()).await;
    let claims = Claims::new_dataplane(
        "default",
        "web-1",
        BTreeMap::from([("app".to_owned(), "web".to_owned())]),
        BTreeMap::new(),
        Duration::from_secs(3600),
        now_unix(),
    )
    .expect("valid claims");
    let token = harness.signing.mint(&claims).expect("mint");
    let asked = names(&["default"]);
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("the token agrees with the rule");
    let response = stream.expect_response().await;
    stream.ack(&response, &asked).await;
    // The same rule again, as a new snapshot carries it: the stream stays.
    let mut same = first.clone();
    same.generation = 2;
    same.changed = Changed::after(&first, Some(vec![web1()].into()));
    harness.publish(same.clone());
    // Then a rule that gives web-1 other labels: the token now contradicts it.
    let mut contradicting = same.clone();
    contradicting.generation = 3;
    contradicting.claim_rules.insert(web1(), rule("db"));
    contradicting.changed = Changed::after(&same, Some(vec![web1()].into()));
    harness.publish(contradicting);
    let status = stream
        .recv()
        .await
        .expect_err("the stream is closed, nothing more is sent");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("app=web"), "{status:?}");
}

#[tokio::test]
async fn an_open_stream_is_closed_when_its_token_expires() {
    let harness = Harness::start().await;
    // Valid for one to two more seconds: it expired 28 s ago, within the verifier's 30 s leeway.
    let leeway = meshca_auth::CLOCK_SKEW_LEEWAY_SECS;
    let issued = now_unix() - leeway;
    let (token, _) = harness.token_with(
        "default",
        "web-1",
        meshca_auth::ProxyType::Dataplane,
        issued,
        std::time::Duration::from_secs(2),
    );
    let mut stream = Sotw::open(
        harness.tls_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("the token is still accepted");
    stream.expect_response().await;
    // At the expiry (plus leeway) the stream ends; nothing more is sent for that token.
    let status = stream.recv().await.expect_err("closed at expiry");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    let status = refused_fetch(&harness, Some(&token), "default.web-1").await;
    assert_eq!(status.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn an_enormous_name_is_refused_and_not_echoed_whole() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-1");
    for name in [
        "x".repeat(1_000_000),
        format!("evil\nforged log line{}", "y".repeat(5000)),
    ] {
        let request = authorized(first_request("default.web-1", &[name.as_str()]), &token);
        let status = SecretDiscoveryServiceClient::new(harness.unix_channel().await)
            .fetch_secrets(request)
            .await
            .expect_err("longer than limits.nameBytes");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{:.300}",
            status.message()
        );
        assert!(status.message().contains("limits.nameBytes"));
        assert!(status.message().len() < 2_000, "{}", status.message().len());
        assert!(
            !status.message().contains('\n'),
            "{:.300}",
            status.message()
        );
        assert!(
            status.message().contains("more bytes"),
            "{:.300}",
            status.message()
        );
    }
}

#[tokio::test]
async fn an_agents_token_gets_no_proxys_secrets() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_with(
        "",
        "host-1",
        ProxyType::Agent,
        now_unix(),
        Duration::from_secs(600),
    );
    // Whatever node it names: the mesh's `.host-1`, or a proxy's.
    for node_id in [".host-1", "default.web-1"] {
        let status =
            refused_stream(&harness, Some(&token), first_request(node_id, &["default"])).await;
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("agent"), "{status:?}");
        let status = refused_fetch(&harness, Some(&token), node_id).await;
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    }
}
