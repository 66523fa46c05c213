//! DeltaSecrets: per-resource subscribe/unsubscribe, initial versions, removals, ACK/NACK.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshca_control::{ProxyEntry, StreamEvent};
use meshca_sds::{StreamKind, SECRET_TYPE_URL};
use meshca_serve::HubOptions;

fn subscribe(node_id: Option<&str>, add: &[&str], remove: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: node_id.and_then(node),
        type_url: SECRET_TYPE_URL.into(),
        resource_names_subscribe: names(add),
        resource_names_unsubscribe: names(remove),
        ..Default::default()
    }
}

fn reply(response: &DeltaDiscoveryResponse, error: Option<&str>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: SECRET_TYPE_URL.into(),
        response_nonce: response.nonce.clone(),
        error_detail: error.map(|message| RpcStatus {
            code: 3,
            message: message.into(),
            details: Vec::new(),
        }),
        ..Default::default()
    }
}

fn versions(response: &DeltaDiscoveryResponse) -> BTreeMap<String, String> {
    response
        .resources
        .iter()
        .map(|resource| {
            let secret = decode_any(resource.resource.as_ref().expect("resource body"));
            assert_eq!(secret.name, resource.name);
            (resource.name.clone(), resource.version.clone())
        })
        .collect()
}

#[tokio::test]
async fn subscribe_unsubscribe_update_and_remove() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), world.snapshot(1)).await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Delta::open(
        harness.tls_channel().await,
        &token,
        subscribe(Some("default.web-1"), &["default", "ROOTCA"], &[]),
    )
    .await
    .expect("delta stream");
    let first = stream.recv().await.expect("initial resources");
    let initial = versions(&first);
    assert_eq!(initial.keys().collect::<Vec<_>>(), ["ROOTCA", "default"]);
    assert!(first.removed_resources.is_empty());
    stream.send(reply(&first, None)).await;
    let acked = harness
        .event(|event| match event {
            StreamEvent::Acked { generation, .. } => Some(generation),
            _ => None,
        })
        .await;
    assert_eq!(acked, 1);
    assert_eq!(harness.server.registry().list()[0].kind, StreamKind::Delta);

    // Subscribing to one more resource sends just that one.
    stream.send(subscribe(None, &["ALL"], &[])).await;
    let added = stream.recv().await.expect("added resource");
    assert_eq!(versions(&added).keys().collect::<Vec<_>>(), ["ALL"]);
    stream.send(reply(&added, None)).await;

    // Unsubscribing sends nothing; a later identity change sends only `default`.
    stream.send(subscribe(None, &[], &["ROOTCA"])).await;
    let mut renewed = world.snapshot(2);
    renewed.proxies.insert(
        web1(),
        ProxyEntry::Ready(identity("spiffe://default.zone/workload/web-1", None)),
    );
    harness.publish(renewed);
    let update = stream.recv().await.expect("identity update");
    let updated = versions(&update);
    assert_eq!(updated.keys().collect::<Vec<_>>(), ["default"]);
    assert_ne!(updated["default"], initial["default"]);
    stream.send(reply(&update, None)).await;

    // The identity going away is a removal.
    let mut gone = world.snapshot(3);
    gone.proxies.insert(
        web1(),
        ProxyEntry::NoIdentity {
            reason: "template".into(),
        },
    );
    harness.publish(gone);
    let removal = stream.recv().await.expect("removal");
    assert!(removal.resources.is_empty());
    assert_eq!(removal.removed_resources, ["default"]);
}

#[tokio::test]
async fn initial_resource_versions_skip_what_the_proxy_holds() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Delta::open(
        harness.unix_channel().await,
        &token,
        subscribe(Some("default.web-1"), &["default", "ROOTCA"], &[]),
    )
    .await
    .expect("delta stream");
    let held = versions(&stream.recv().await.expect("resources"));
    drop(stream);

    let mut first = subscribe(Some("default.web-1"), &["default", "ROOTCA"], &[]);
    first.initial_resource_versions = HashMap::from([
        ("default".to_owned(), held["default"].clone()),
        ("ROOTCA".to_owned(), "some-old-version".to_owned()),
    ]);
    let mut stream = Delta::open(harness.unix_channel().await, &token, first)
        .await
        .expect("delta stream");
    let response = stream.recv().await.expect("resources");
    assert_eq!(versions(&response).keys().collect::<Vec<_>>(), ["ROOTCA"]);
}

#[tokio::test]
async fn nack_and_stale_nonce() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), world.snapshot(1)).await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Delta::open(
        harness.unix_channel().await,
        &token,
        subscribe(Some("default.web-1"), &["default"], &[]),
    )
    .await
    .expect("delta stream");
    let first = stream.recv().await.expect("resources");
    let mut renewed = world.snapshot(2);
    renewed.proxies.insert(
        web1(),
        ProxyEntry::Ready(identity("spiffe://default.zone/workload/web-1", None)),
    );
    harness.publish(renewed);
    let second = stream.recv().await.expect("update");
    // ACK of the first (now stale) nonce is ignored; the NACK of the second is recorded.
    stream.send(reply(&first, None)).await;
    stream.send(reply(&second, Some("rejected"))).await;
    let event = harness
        .event(|event| match event {
            StreamEvent::Acked { .. } => Some(Err(())),
            StreamEvent::Nacked {
                generation,
                version,
                message,
                ..
            } => Some(Ok((generation, version, message))),
            _ => None,
        })
        .await;
    assert_eq!(
        event,
        Ok((2, second.system_version_info.clone(), "rejected".to_owned()))
    );
    let info = &harness.server.registry().list()[0];
    assert_eq!(info.nacks, 1);
}
