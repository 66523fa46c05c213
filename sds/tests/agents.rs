//! Dataplanes a `meshca agent` serves: their keys are on the agent's host, so SDS refuses their
//! tokens, and never sends a certificate without its private key.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use meshca_control::{
    Changed, LeafKey, ProxyEntry, ProxyIdentity, ProxyKey, Registration, Registrations, Snapshot,
    StreamEvent,
};
use meshca_sds::SECRET_TYPE_URL;
use meshca_serve::HubOptions;
use tonic::Code;

const REFUSAL: &str =
    "dataplane default/web-1 is served by meshca agent host-1: its key is on that host";

/// web-1 served by agent host-1.
fn served_by_host1() -> Arc<Registrations> {
    Arc::new(Registrations::new(vec![Registration {
        name: "billing".into(),
        proxy: web1(),
        selectors: Vec::new(),
        agent: Some("host-1".into()),
        hint: None,
        jwt_svid_expiry: Duration::from_secs(300),
        labels: Default::default(),
    }]))
}

fn agent_served(world: &World, generation: u64) -> Snapshot {
    let mut snapshot = world.snapshot(generation);
    snapshot.registrations = served_by_host1();
    snapshot
}

/// The Connected events up to and including web-2's, which this test then opens: everything
/// emitted before it is in the channel first.
async fn connected_until_web2(harness: &mut Harness) -> Vec<ProxyKey> {
    let (token, _) = harness.token_for("default", "web-2");
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request("default.web-2", &["default"]),
    )
    .await
    .expect("web-2 is served here");
    stream.expect_response().await;
    let mut connected = Vec::new();
    loop {
        let key = harness
            .event(|event| match event {
                StreamEvent::Connected { claims, .. } => {
                    Some(ProxyKey::new(claims.mesh.clone(), claims.name.clone()))
                }
                _ => None,
            })
            .await;
        let web2 = key == ProxyKey::new("default", "web-2");
        connected.push(key);
        if web2 {
            return connected;
        }
    }
}

#[tokio::test]
async fn a_token_for_an_agent_served_dataplane_is_refused_on_streams_and_fetches() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), agent_served(&world, 1)).await;
    let (token, _) = harness.token_for("default", "web-1");

    let refused = match Sotw::open(
        harness.tls_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    {
        Err(status) => status,
        Ok(mut stream) => stream.recv().await.expect_err("no response for web-1"),
    };
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(refused.message(), REFUSAL);

    let delta = match Delta::open(
        harness.unix_channel().await,
        &token,
        DeltaDiscoveryRequest {
            node: node("default.web-1"),
            type_url: SECRET_TYPE_URL.into(),
            resource_names_subscribe: names(&["default"]),
            ..Default::default()
        },
    )
    .await
    {
        Err(status) => status,
        Ok(mut stream) => stream.recv().await.expect_err("no response for web-1"),
    };
    assert_eq!(delta.code(), Code::PermissionDenied, "{delta:?}");
    assert_eq!(delta.message(), REFUSAL);

    let fetched = SecretDiscoveryServiceClient::new(harness.unix_channel().await)
        .fetch_secrets(authorized(
            first_request("default.web-1", &["default"]),
            &token,
        ))
        .await
        .expect_err("refused");
    assert_eq!(fetched.code(), Code::PermissionDenied, "{fetched:?}");
    assert_eq!(fetched.message(), REFUSAL);

    // None of them spoke for web-1 to the owner (its gate must not count them).
    assert_eq!(
        connected_until_web2(&mut harness).await,
        [ProxyKey::new("default", "web-2")]
    );
}

#[tokio::test]
async fn an_open_stream_is_refused_once_its_dataplane_is_served_by_an_agent() {
    let world = World::new();
    let first = world.snapshot(1);
    let harness = Harness::start_with(HubOptions::default(), first.clone()).await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("web-1 is served here for now");
    let response = stream.expect_response().await;
    stream.ack(&response, &names(&["default"])).await;

    let mut moved = agent_served(&world, 2);
    moved.changed = Changed::after(&first, Some(vec![web1()].into()));
    harness.publish(moved);
    let status = stream.recv().await.expect_err("the stream is ended");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), REFUSAL);
}

/// web-1's identity as an agent holds its key: the certificate, and no private key here.
fn keyless(world: &World) -> Arc<ProxyIdentity> {
    let (_private, public) =
        meshca_ca::PrivateKey::generate(meshca_ca::KeyAlgorithm::EcdsaP256).expect("a key");
    Arc::new(ProxyIdentity {
        spiffe_id: world.web1.spiffe_id.clone(),
        identity_name: world.web1.identity_name.clone(),
        chain_pem: world.web1.chain_pem.clone(),
        key: LeafKey::Agent(Arc::new(public)),
    })
}

#[tokio::test]
async fn an_identity_whose_key_an_agent_holds_is_never_sent_without_it() {
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot
        .proxies
        .insert(web1(), ProxyEntry::Ready(keyless(&world)));
    let harness = Harness::start_with(HubOptions::default(), snapshot).await;
    let (token, _) = harness.token_for("default", "web-1");
    let expected = "proxy default.web-1 is refused: the identity spiffe://default.zone/workload/web-1 is certified over a key that a meshca agent holds on its host: SDS has no private key to serve with it";

    // The trust alone is served; asking for the identity ends the stream.
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request("default.web-1", &["system_trust_bundle"]),
    )
    .await
    .expect("opened");
    let response = stream.expect_response().await;
    assert_eq!(secrets(&response).len(), 1);
    stream
        .ack(&response, &names(&["system_trust_bundle"]))
        .await;
    stream
        .send(first_request(
            "default.web-1",
            &["system_trust_bundle", "default"],
        ))
        .await;
    let status = stream
        .recv()
        .await
        .expect_err("refused, never a key-less secret");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), expected);

    let mut delta = Delta::open(
        harness.unix_channel().await,
        &token,
        DeltaDiscoveryRequest {
            node: node("default.web-1"),
            type_url: SECRET_TYPE_URL.into(),
            resource_names_subscribe: names(&["default"]),
            ..Default::default()
        },
    )
    .await
    .expect("opened");
    let status = delta.recv().await.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), expected);

    let fetched = SecretDiscoveryServiceClient::new(harness.unix_channel().await)
        .fetch_secrets(authorized(
            first_request("default.web-1", &["default"]),
            &token,
        ))
        .await
        .expect_err("refused");
    assert_eq!(fetched.code(), Code::PermissionDenied, "{fetched:?}");
    assert_eq!(fetched.message(), expected);
}
