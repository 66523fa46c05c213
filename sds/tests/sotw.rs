//! StreamSecrets protocol: versions, ACK/NACK, stale nonces, subscriptions, waiting for
//! identities, events and the registry.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use meshca_control::{Changed, ProxyEntry, ProxyKey, StreamEvent};
use meshca_sds::StreamKind;
use meshca_serve::{HubOptions, StreamMetrics};
use tonic::Code;

async fn open_web1(harness: &Harness, resources: &[&str]) -> Sotw {
    open_proxy(harness, "web-1", resources).await
}

/// A stream of proxy `name` of mesh `default`, with its own token, asking for `resources`.
async fn open_proxy(harness: &Harness, name: &str, resources: &[&str]) -> Sotw {
    let (token, _) = harness.token_for("default", name);
    Sotw::open(
        harness.tls_channel().await,
        Some(&token),
        first_request(&format!("default.{name}"), resources),
    )
    .await
    .expect("stream opens")
}

fn acked(event: StreamEvent) -> Option<(u64, String)> {
    match event {
        StreamEvent::Acked {
            generation,
            version,
            ..
        } => Some((generation, version)),
        _ => None,
    }
}

fn subscribed(event: StreamEvent) -> Option<Vec<String>> {
    match event {
        StreamEvent::Subscribed { resources, .. } => {
            Some(resources.iter().map(ToString::to_string).collect())
        }
        _ => None,
    }
}

#[tokio::test]
async fn version_changes_iff_content_changes_and_pushes_follow_acks() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), world.snapshot(1)).await;
    let asked = names(&["default", "ROOTCA"]);
    let mut stream = open_web1(&harness, &["default", "ROOTCA"]).await;
    let first = stream.expect_response().await;
    assert_eq!(first.type_url, meshca_sds::SECRET_TYPE_URL);
    assert!(!first.version_info.is_empty() && !first.nonce.is_empty());
    assert_eq!(harness.event(subscribed).await, asked);
    stream.ack(&first, &asked).await;
    let (generation, version) = harness.event(acked).await;
    assert_eq!(
        (generation, version.as_str()),
        (1, first.version_info.as_str())
    );

    // Same content under a new generation: no push, the ACKed state is now generation 2.
    harness.publish(world.snapshot(2));
    let (generation, version) = harness.event(acked).await;
    assert_eq!(
        (generation, version.as_str()),
        (2, first.version_info.as_str())
    );

    // New identity for web-1: pushed, new version, new nonce.
    let mut changed = world.snapshot(3);
    let renewed = identity("spiffe://default.zone/workload/web-1", Some("mi-web"));
    changed
        .proxies
        .insert(web1(), ProxyEntry::Ready(renewed.clone()));
    harness.publish(changed);
    let second = stream.expect_response().await;
    assert_ne!(second.version_info, first.version_info);
    assert_ne!(second.nonce, first.nonce);
    let served = secrets(&second);
    let (chain, _) = meshca_sds::tls_certificate_parts(&served["default"]).expect("identity");
    assert_eq!(chain, renewed.chain_pem);
    stream.ack(&second, &asked).await;
    let (generation, version) = harness.event(acked).await;
    assert_eq!((generation, version), (3, second.version_info.clone()));

    let info = harness.server.registry().list();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].kind, StreamKind::Sotw);
    assert_eq!(info[0].proxy, web1());
    assert_eq!(
        info[0].last_acked_version.as_deref(),
        Some(second.version_info.as_str())
    );
    assert_eq!(info[0].acked_generation, Some(3));
    assert_eq!(StreamMetrics::get(&harness.server.metrics().acks), 2);
    assert_eq!(
        StreamMetrics::get(&harness.server.metrics().responses_pushed),
        2
    );
}

#[tokio::test]
async fn same_content_gives_the_same_version_on_another_stream() {
    let harness = Harness::start().await;
    let mut a = open_web1(&harness, &["default", "ROOTCA"]).await;
    let mut b = open_web1(&harness, &["default", "ROOTCA"]).await;
    let (ra, rb) = (a.expect_response().await, b.expect_response().await);
    assert_eq!(ra.version_info, rb.version_info);
    let mut c = open_web1(&harness, &["ROOTCA"]).await;
    assert_ne!(c.expect_response().await.version_info, ra.version_info);
}

#[tokio::test]
async fn nack_is_recorded_and_nothing_is_resent() {
    let mut harness = Harness::start().await;
    let asked = names(&["default"]);
    let mut stream = open_web1(&harness, &["default"]).await;
    let first = stream.expect_response().await;
    stream.nack(&first, &asked, "bad key").await;
    let (generation, message) = harness
        .event(|event| match event {
            StreamEvent::Nacked {
                generation,
                message,
                version,
                ..
            } => {
                assert_eq!(version, first.version_info);
                Some((generation, message))
            }
            _ => None,
        })
        .await;
    assert_eq!((generation, message.as_str()), (1, "bad key"));
    let info = &harness.server.registry().list()[0];
    assert_eq!(
        (info.nacks, info.last_nack.as_deref()),
        (1, Some("bad key"))
    );
    assert_eq!(info.last_acked_version, None);
    assert_eq!(StreamMetrics::get(&harness.server.metrics().nacks), 1);

    // The next response is the one for a new subscription, not a re-send of the NACKed one.
    stream
        .send(meshca_sds_request(&first.nonce, "", &["default", "ROOTCA"]))
        .await;
    let next = stream.expect_response().await;
    assert_eq!(
        secrets(&next).keys().collect::<Vec<_>>(),
        ["ROOTCA", "default"]
    );
}

fn meshca_sds_request(
    nonce: &str,
    version: &str,
    resources: &[&str],
) -> envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
    envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
        version_info: version.into(),
        resource_names: names(resources),
        type_url: meshca_sds::SECRET_TYPE_URL.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn stale_nonce_is_ignored() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), world.snapshot(1)).await;
    let asked = names(&["default", "ROOTCA"]);
    let mut stream = open_web1(&harness, &["default", "ROOTCA"]).await;
    let first = stream.expect_response().await;
    stream.ack(&first, &asked).await;
    harness.event(acked).await;
    let mut changed = world.snapshot(2);
    changed.proxies.insert(
        web1(),
        ProxyEntry::Ready(identity("spiffe://default.zone/workload/web-1", None)),
    );
    harness.publish(changed);
    let second = stream.expect_response().await;

    // A request naming the first (stale) nonce, even with other names, is ignored...
    stream
        .send(meshca_sds_request(
            &first.nonce,
            &first.version_info,
            &["default"],
        ))
        .await;
    // ...so the ACK of the second response is the next thing that counts.
    stream.ack(&second, &asked).await;
    let (generation, version) = harness.event(acked).await;
    assert_eq!(
        (generation, version.as_str()),
        (2, second.version_info.as_str())
    );
    // And the next response answers the next subscription change, not the stale request.
    stream
        .send(meshca_sds_request(
            &second.nonce,
            &second.version_info,
            &["default", "ROOTCA", "ALL"],
        ))
        .await;
    let third = stream.expect_response().await;
    assert_eq!(third.resources.len(), 3);
    assert_eq!(
        StreamMetrics::get(&harness.server.metrics().responses_pushed),
        3
    );
}

#[tokio::test]
async fn pending_then_ready_wakes_the_waiting_stream() {
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot.proxies.remove(&web1());
    let mut harness = Harness::start_with(HubOptions::default(), snapshot).await;
    let mut stream = open_web1(&harness, &["default"]).await;
    let claims = harness
        .event(|event| match event {
            StreamEvent::Connected { claims, .. } => Some(claims),
            _ => None,
        })
        .await;
    assert_eq!(claims.node_id(), "default.web-1");
    let mut pending = world.snapshot(2);
    pending.proxies.insert(web1(), ProxyEntry::Pending);
    harness.publish(pending);
    harness.publish(world.snapshot(3));
    let response = stream.expect_response().await;
    let (chain, _) =
        meshca_sds::tls_certificate_parts(&secrets(&response)["default"]).expect("identity");
    assert_eq!(chain, world.web1.chain_pem);
}

#[tokio::test]
async fn identity_that_never_comes_is_unavailable() {
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot.proxies.insert(web1(), ProxyEntry::Pending);
    let options = HubOptions::default().with_identity_wait(Duration::from_millis(200));
    let harness = Harness::start_with(options, snapshot).await;
    let mut stream = open_web1(&harness, &["default"]).await;
    let status = stream.recv().await.expect_err("no identity");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("default.web-1"), "{status:?}");
}

#[tokio::test]
async fn refused_proxy_is_permission_denied_at_connect_and_mid_stream() {
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot.proxies.insert(
        web1(),
        ProxyEntry::Refused {
            reason: "labels contradict Dataplane web-1".into(),
        },
    );
    let harness = Harness::start_with(HubOptions::default(), snapshot).await;
    let mut stream = open_web1(&harness, &["default"]).await;
    let status = stream.recv().await.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("labels contradict"));

    harness.publish(world.snapshot(2));
    let mut stream = open_web1(&harness, &["default"]).await;
    stream.expect_response().await;
    let mut refused = world.snapshot(3);
    refused.proxies.insert(
        web1(),
        ProxyEntry::Refused {
            reason: "now refused".into(),
        },
    );
    harness.publish(refused);
    let status = stream.recv().await.expect_err("refused mid-stream");
    assert_eq!(status.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn disconnect_is_reported_and_unregistered() {
    let mut harness = Harness::start().await;
    let mut stream = open_web1(&harness, &["default"]).await;
    stream.expect_response().await;
    assert_eq!(
        StreamMetrics::get(&harness.server.metrics().streams_open),
        1
    );
    let stream_id = harness.server.registry().list()[0].id;
    drop(stream);
    let id = harness
        .event(|event| match event {
            StreamEvent::Disconnected { stream } => Some(stream),
            _ => None,
        })
        .await;
    assert_eq!(id, stream_id);
    assert!(harness.server.registry().is_empty());
    assert_eq!(
        StreamMetrics::get(&harness.server.metrics().streams_open),
        0
    );
}

#[tokio::test]
async fn nothing_available_sends_nothing_until_it_is() {
    let world = World::new();
    let mut snapshot = world.snapshot(1);
    snapshot.egress = None;
    let mut harness = Harness::start_with(HubOptions::default(), snapshot).await;
    let mut stream = open_web1(&harness, &["system_trust_bundle_egress", "no-such-name"]).await;
    harness
        .event(|event| matches!(event, StreamEvent::Connected { .. }).then_some(()))
        .await;
    let mut with_egress = world.snapshot(2);
    with_egress.egress = Some(Arc::new(meshca_control::MeshServiceTrust::new(
        Arc::new(meshca_control::TrustBundle::new(
            [("egress.zone".to_owned(), vec![ca_pem("egress.zone")])].into(),
        )),
        ["spiffe://egress.zone/egress".to_owned()].into(),
    )));
    harness.publish(with_egress);
    let response = stream.expect_response().await;
    assert_eq!(
        secrets(&response).keys().collect::<Vec<_>>(),
        ["system_trust_bundle_egress"]
    );
}

#[tokio::test]
async fn a_snapshot_that_changes_one_proxy_wakes_only_its_streams() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), world.snapshot(1)).await;
    let asked = names(&["default"]);
    let mut stream1 = open_web1(&harness, &["default"]).await;
    let mut stream2 = open_proxy(&harness, "web-2", &["default"]).await;
    let (first1, first2) = (
        stream1.expect_response().await,
        stream2.expect_response().await,
    );
    stream1.ack(&first1, &asked).await;
    stream2.ack(&first2, &asked).await;
    let web2_stream = harness
        .event(|e| match e {
            StreamEvent::Connected { stream, claims } if claims.name == "web-2" => Some(stream),
            _ => None,
        })
        .await;
    let web2_acked = |e: StreamEvent| match e {
        StreamEvent::Acked {
            stream, generation, ..
        } if stream == web2_stream => Some(generation),
        _ => None,
    };
    assert_eq!(harness.event(web2_acked).await, 1);
    // Generation 2 changes web-1's certificate only, and says so.
    let mut renewed = world.snapshot(2);
    renewed.proxies.insert(
        web1(),
        ProxyEntry::Ready(identity(
            "spiffe://default.zone/workload/web-1",
            Some("mi-web"),
        )),
    );
    renewed.changed = meshca_control::Changed::after(&world.snapshot(1), Some(vec![web1()].into()));
    harness.publish(renewed.clone());
    let second = stream1.expect_response().await;
    assert_ne!(
        second.version_info, first1.version_info,
        "web-1 gets its new certificate"
    );
    stream1.ack(&second, &asked).await;
    // Generation 3 says anything may have changed: every stream looks, web-2 finds nothing new and
    // reports its ACK under generation 3. It never heard of generation 2.
    let mut everyone = renewed;
    everyone.generation = 3;
    everyone.changed = meshca_control::Changed::default();
    harness.publish(everyone);
    assert_eq!(
        harness.event(web2_acked).await,
        3,
        "web-2 was woken for web-1's change"
    );
}

/// An idle stream keeps the trust it was answered from, not the snapshot: a fleet idle on many
/// generations would otherwise keep each generation's copy of the proxy tables alive.
#[tokio::test]
async fn an_idle_stream_does_not_keep_the_snapshot_it_was_answered_from() {
    let world = World::new();
    let web2 = ProxyKey::new("default", "web-2");
    let mut first = world.snapshot(1);
    first.proxies.insert(web2.clone(), ProxyEntry::Pending);
    let harness = Harness::start_with(HubOptions::default(), first).await;
    let first = Arc::downgrade(&harness.snapshots.borrow());
    let mut idle = open_web1(&harness, &["default", "system_trust_bundle"]).await;
    idle.expect_response().await;
    let mut waiting = open_proxy(&harness, "web-2", &["default"]).await;
    // The next generation changes web-2 only: web-1's stream stays idle on what it was sent.
    let mut second = world.snapshot(2);
    second.changed = Changed::after(
        &first.upgrade().expect("the first snapshot is current"),
        Some(Arc::from(vec![web2])),
    );
    harness.publish(second);
    // web-2 answered from the second generation: the server has seen it.
    waiting.expect_response().await;
    assert!(
        first.upgrade().is_none(),
        "the idle stream still holds the first snapshot"
    );
}
