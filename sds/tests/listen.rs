//! Listeners: unix socket hygiene, loopback-only plaintext, TLS, shutdown; and the client.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use meshca_auth::{RevocationList, SigningKey};
use meshca_control::{ProxyEntry, StreamEvent};
use meshca_sds::{ClientError, SdsClient, SdsServer};
use meshca_serve::{
    bind, BoundAddr, ClientTls, ConnectError, Hub, HubOptions, ListenError, Listener,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn unix_socket_is_group_only_and_stale_files_are_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sds.sock");
    // A socket file left behind by a dead process.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale socket"));
    assert!(path.exists());
    let bound = bind(vec![Listener::Unix(path.clone())])
        .await
        .expect("stale socket replaced");
    let mode = std::fs::metadata(&path)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode & !0o660, 0, "mode {mode:o} is 0660 or stricter");
    assert_eq!(bound.local_addrs(), [BoundAddr::Unix(path.clone())]);

    // A live socket is not stolen.
    match bind(vec![Listener::Unix(path.clone())]).await {
        Err(ListenError::SocketInUse { path: named }) => assert_eq!(named, path),
        other => panic!("expected SocketInUse, got {other:?}"),
    }
    drop(bound);

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "data").expect("file");
    assert!(matches!(
        bind(vec![Listener::Unix(file.clone())]).await,
        Err(ListenError::NotASocket { .. })
    ));
    assert_eq!(std::fs::read_to_string(&file).expect("file kept"), "data");

    let orphan = dir.path().join("missing").join("sds.sock");
    let error = bind(vec![Listener::Unix(orphan)])
        .await
        .expect_err("missing parent");
    assert!(matches!(error, ListenError::MissingParent { .. }));
    assert!(error.to_string().contains("missing"), "{error}");
}

#[tokio::test]
async fn plaintext_tcp_only_on_loopback() {
    for addr in ["0.0.0.0:0", "192.0.2.1:5678", "[::]:0"] {
        let error = bind(vec![Listener::InsecureLoopback(
            addr.parse().expect("addr"),
        )])
        .await
        .expect_err("non-loopback plaintext");
        assert!(
            matches!(error, ListenError::NotLoopback { .. }),
            "{addr}: {error}"
        );
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let addr = taken.local_addr().expect("addr");
    let error = bind(vec![Listener::InsecureLoopback(addr)])
        .await
        .expect_err("port in use");
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}

#[tokio::test]
async fn insecure_loopback_serves_and_shutdown_drains() {
    let world = World::new();
    let (_snapshots_tx, snapshots) = watch::channel(Arc::new(world.snapshot(1)));
    let (_revocations_tx, revocations) = watch::channel(Arc::new(RevocationList::new()));
    let (events, _events_rx) = mpsc::channel(meshca_serve::EVENT_BUFFER);
    let (signing, _) = SigningKey::generate().expect("key");
    let server = SdsServer::on(Hub::new(
        snapshots,
        signing.verifier(),
        revocations,
        events,
        HubOptions::default(),
    ));
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("sds.sock");
    let bound = bind(vec![
        Listener::InsecureLoopback("127.0.0.1:0".parse().expect("addr")),
        Listener::Unix(socket.clone()),
    ])
    .await
    .expect("bind");
    let BoundAddr::InsecureLoopback(addr) = bound.local_addrs()[0] else {
        panic!("loopback")
    };
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(server.serve(bound, shutdown.clone()));

    let claims = meshca_auth::Claims::new_dataplane(
        "default",
        "web-1",
        Default::default(),
        Default::default(),
        Duration::from_secs(600),
        now_unix(),
    )
    .expect("claims");
    let token = signing.mint(&claims).expect("mint");
    let mut client = SdsClient::connect(&addr.to_string(), None, token.clone())
        .await
        .expect("connect");
    let secrets = client
        .fetch("default.web-1", &names(&["default"]), None)
        .await
        .expect("fetch");
    assert_eq!(secrets[0].name, "default");

    let mut stream = Sotw::open(
        meshca_serve::connect_channel(&format!("unix://{}", socket.display()), None)
            .await
            .expect("unix"),
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("stream");
    stream.expect_response().await;
    shutdown.cancel();
    let status = stream.recv().await.expect_err("stream closed on shutdown");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("server stops")
        .expect("task")
        .expect("clean shutdown");
    assert!(!socket.exists(), "socket file removed on shutdown");
}

#[tokio::test]
async fn client_over_tls_checks_the_server_certificate() {
    let harness = Harness::start().await;
    let (token, _) = harness.token_for("default", "web-1");
    let target = format!("localhost:{}", harness.tls_addr.port());
    let tls = ClientTls {
        ca_pem: harness.server_ca_pem.clone().into_bytes(),
        server_name: "localhost".into(),
    };
    let mut client = SdsClient::connect(&target, Some(tls), token.clone())
        .await
        .expect("TLS connect");
    client
        .fetch("default.web-1", &names(&["ROOTCA"]), None)
        .await
        .expect("fetch over TLS");

    let (_, wrong_ca) = server_tls();
    let wrong = ClientTls {
        ca_pem: wrong_ca.into_bytes(),
        server_name: "localhost".into(),
    };
    let error = SdsClient::connect(&target, Some(wrong), token.clone())
        .await
        .expect_err("untrusted server");
    assert!(
        matches!(error, ClientError::Channel(ConnectError::Connect { .. })),
        "{error}"
    );

    // Plaintext to the TLS port does not get through.
    let error = async {
        SdsClient::connect(&target, None, token)
            .await?
            .fetch("default.web-1", &names(&["ROOTCA"]), None)
            .await
    };
    assert!(error.await.is_err());

    for bad in ["", "unix://", "http://localhost:1", "localhost"] {
        assert!(
            matches!(
                SdsClient::connect(bad, None, "t".into()).await,
                Err(ClientError::Channel(ConnectError::InvalidTarget { .. }))
            ),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn client_stream_acks_like_envoy() {
    let world = World::new();
    let mut harness = Harness::start_with(HubOptions::default(), world.snapshot(1)).await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut client = SdsClient::connect(&harness.unix_target, None, token)
        .await
        .expect("connect");
    let stream = client
        .stream("default.web-1", &names(&["default", "ROOTCA"]), None)
        .await
        .expect("stream");
    let mut stream = Box::pin(stream);
    let first = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("in time")
        .expect("item")
        .expect("secrets");
    assert_eq!(first.len(), 2);
    harness
        .event(|event| matches!(event, StreamEvent::Acked { generation: 1, .. }).then_some(()))
        .await;

    let renewed = identity("spiffe://default.zone/workload/web-1", None);
    let mut changed = world.snapshot(2);
    changed
        .proxies
        .insert(web1(), ProxyEntry::Ready(renewed.clone()));
    harness.publish(changed);
    let second = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("in time")
        .expect("item")
        .expect("secrets");
    let identity = second
        .iter()
        .find(|secret| secret.name == "default")
        .expect("default");
    let (chain, _) = meshca_sds::tls_certificate_parts(identity).expect("identity");
    assert_eq!(chain, renewed.chain_pem);
    harness
        .event(|event| matches!(event, StreamEvent::Acked { generation: 2, .. }).then_some(()))
        .await;
}
