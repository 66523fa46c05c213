//! The limits on what a client can make the server hold or wait for: connections per listener,
//! silent connections, header blocks on the unix socket, streams per proxy, names per stream.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::config::core::v3::Extension;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use meshca_sds::SECRET_TYPE_URL;
use meshca_serve::{HubOptions, StreamLimits};
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tonic::Code;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn harness_with(limits: StreamLimits) -> Harness {
    let options = HubOptions::default().with_limits(limits);
    Harness::start_with(options, World::new().snapshot(1)).await
}

fn socket_path(harness: &Harness) -> String {
    harness
        .unix_target
        .strip_prefix("unix://")
        .expect("a unix target")
        .to_owned()
}

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads until the server closes the connection (EOF or an error), discarding what it sends.
async fn closed_by_server(stream: &mut (impl AsyncReadExt + Unpin)) {
    let mut buf = [0u8; 4096];
    let closed = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(WAIT, closed)
        .await
        .expect("the server closes the connection");
}

#[tokio::test]
async fn a_header_block_past_the_header_list_limit_closes_the_unix_connection() {
    let harness = Harness::start().await;
    let mut stream = UnixStream::connect(socket_path(&harness))
        .await
        .expect("connect");
    let mut start = PREFACE.to_vec();
    start.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    start.extend(frame(0x1, 0, 1, &[0x82; 100])); // HEADERS without END_HEADERS
    stream.write_all(&start).await.expect("the preface is read");
    // CONTINUATION frames forever: the server must stop reading them long before this ends.
    let continuation = frame(0x9, 0, 1, &[0x82; 16 * 1024]);
    let mut written = 0usize;
    let refused = loop {
        if written > 64 * 1024 * 1024 {
            break false;
        }
        match stream.write_all(&continuation).await {
            Ok(()) => written += continuation.len(),
            Err(_) => break true,
        }
    };
    assert!(
        refused,
        "the server took {written} bytes of one header block without closing the connection"
    );
}

/// Held bytes never exceed the bound, whatever the frames: empty CONTINUATION frames carry no header
/// block bytes, but each is a 9-byte frame the rewriter would hold, so they count too.
#[tokio::test]
async fn a_flood_of_empty_continuation_frames_closes_the_unix_connection() {
    // The connect timeout would close the connection anyway: only the flood may close it here.
    let harness = harness_with(StreamLimits {
        connect_timeout: Duration::from_secs(600),
        ..StreamLimits::default()
    })
    .await;
    let mut stream = UnixStream::connect(socket_path(&harness))
        .await
        .expect("connect");
    let mut start = PREFACE.to_vec();
    start.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    start.extend(frame(0x1, 0, 1, &[0x82])); // HEADERS without END_HEADERS
    stream.write_all(&start).await.expect("the preface is read");
    let empty = frame(0x9, 0, 1, &[]);
    let flood: Vec<u8> = empty.repeat(64 * 1024 / empty.len());
    let mut written = 0usize;
    let refused = loop {
        if written > 16 * 1024 * 1024 {
            break false;
        }
        match stream.write_all(&flood).await {
            Ok(()) => written += flood.len(),
            Err(_) => break true,
        }
    };
    assert!(
        refused,
        "the server took {} empty CONTINUATION frames of one header block without closing the connection",
        written / empty.len()
    );
    closed_by_server(&mut stream).await;
}

#[tokio::test]
async fn silent_connections_are_closed_after_the_connect_timeout() {
    let harness = harness_with(StreamLimits {
        connect_timeout: Duration::from_millis(500),
        ..StreamLimits::default()
    })
    .await;
    // A unix connection that sends nothing.
    let mut silent = UnixStream::connect(socket_path(&harness))
        .await
        .expect("connect");
    // One that sends the HTTP/2 preface and settings, and then no request.
    let mut preface_only = UnixStream::connect(socket_path(&harness))
        .await
        .expect("connect");
    let mut start = PREFACE.to_vec();
    start.extend(frame(0x4, 0, 0, &[]));
    preface_only.write_all(&start).await.expect("write");
    // A TLS connection that completes its handshake and sends nothing.
    let mut tls = tls_connect(&harness).await;
    closed_by_server(&mut silent).await;
    closed_by_server(&mut preface_only).await;
    closed_by_server(&mut tls).await;
}

async fn tls_connect(harness: &Harness) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(harness.server_ca_pem.as_bytes()) {
        roots.add(cert.expect("PEM")).expect("a CA");
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the defaults")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(harness.tls_addr)
        .await
        .expect("connect");
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect("localhost".try_into().expect("a DNS name"), tcp)
        .await
        .expect("the TLS handshake completes")
}

#[tokio::test]
async fn a_listener_at_its_connection_limit_sheds_new_connections_and_the_others_serve() {
    let harness = harness_with(StreamLimits {
        connections_per_listener: 2,
        ..StreamLimits::default()
    })
    .await;
    let held = [
        UnixStream::connect(socket_path(&harness)).await.expect("1"),
        UnixStream::connect(socket_path(&harness)).await.expect("2"),
    ];
    let mut third = UnixStream::connect(socket_path(&harness))
        .await
        .expect("the kernel accepts; the server closes");
    closed_by_server(&mut third).await;
    let shed = &harness.server.metrics().connections_shed;
    assert_eq!(shed.load(Ordering::Relaxed), 1);
    // The TLS listener has its own limit and still serves.
    let (token, _) = harness.token_for("default", "web-1");
    let mut stream = Sotw::open(
        harness.tls_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("the TLS listener serves");
    stream.expect_response().await;
    // A closed connection frees its slot.
    drop(held);
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&token),
        first_request("default.web-1", &["default"]),
    )
    .await
    .expect("the unix listener serves again");
    stream.expect_response().await;
}

#[tokio::test]
async fn one_proxy_cannot_open_more_streams_than_its_limit() {
    let mut harness = harness_with(StreamLimits {
        streams_per_proxy: 2,
        ..StreamLimits::default()
    })
    .await;
    let (token, _) = harness.token_for("default", "web-1");
    let first = open(&harness, &token)
        .await
        .expect("the first stream is served");
    let _second = open(&harness, &token)
        .await
        .expect("the second stream is served");
    let status = open(&harness, &token)
        .await
        .err()
        .expect("the third is refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("limits.streamsPerProxy"),
        "{status:?}"
    );
    // Another proxy is not affected.
    let (other, _) = harness.token_for("default", "web-2");
    let mut stream = Sotw::open(
        harness.unix_channel().await,
        Some(&other),
        first_request("default.web-2", &["default"]),
    )
    .await
    .expect("authenticated");
    let _ = stream.recv().await;
    // Closing a stream frees its slot.
    drop(first);
    harness
        .event(|event| match event {
            meshca_control::StreamEvent::Disconnected { .. } => Some(()),
            _ => None,
        })
        .await;
    while harness.server.registry().len() > 2 {
        tokio::task::yield_now().await;
    }
    open(&harness, &token)
        .await
        .expect("a closed stream's slot is free again");
}

/// Opens a stream for `default.web-1` and returns it once served, or the status that ended it.
async fn open(harness: &Harness, token: &str) -> Result<Sotw, tonic::Status> {
    let first = first_request("default.web-1", &["default"]);
    let mut stream = Sotw::open(harness.unix_channel().await, Some(token), first)
        .await
        .expect("authenticated");
    stream.recv().await.map(|_| stream)
}

#[tokio::test]
async fn a_stream_cannot_subscribe_to_more_names_than_its_limit() {
    let harness = harness_with(StreamLimits {
        names_per_stream: 3,
        ..StreamLimits::default()
    })
    .await;
    let (token, _) = harness.token_for("default", "web-1");
    // State of the world: one request with too many names.
    let first = first_request("default.web-1", &["default", "a", "b", "c"]);
    let mut stream = Sotw::open(harness.unix_channel().await, Some(&token), first)
        .await
        .expect("authenticated");
    let status = stream.recv().await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("limits.namesPerStream"),
        "{status:?}"
    );
    // Delta: subscriptions add up over requests.
    let subscribe = |names: &[&str], node_id: &str| DeltaDiscoveryRequest {
        node: node(node_id),
        type_url: SECRET_TYPE_URL.into(),
        resource_names_subscribe: common::names(names),
        ..Default::default()
    };
    let mut delta = Delta::open(
        harness.unix_channel().await,
        &token,
        subscribe(&["default", "x"], "default.web-1"),
    )
    .await
    .expect("authenticated");
    delta.recv().await.expect("two names are served");
    delta.send(subscribe(&["y", "z"], "")).await;
    let status = delta.recv().await.expect_err("four names are too many");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        harness.server.metrics().over_limit.load(Ordering::Relaxed),
        2
    );
}

#[tokio::test]
async fn a_first_request_larger_than_the_flow_control_windows_is_read_whole() {
    // Envoy's node lists its extensions; this one is larger than a stream's window and a connection's,
    // so it arrives only as the server reads it.
    let harness = harness_with(StreamLimits::default()).await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut first = first_request("default.web-1", &["default"]);
    first.node.as_mut().expect("a node").extensions = (0..6000)
        .map(|i| Extension {
            name: format!("envoy.filters.http.extension_{i:05}"),
            category: "envoy.filters.http".into(),
            ..Default::default()
        })
        .collect();
    assert!(prost::Message::encoded_len(&first) > 300 * 1024);
    let mut stream = Sotw::open(harness.unix_channel().await, Some(&token), first)
        .await
        .expect("authenticated");
    stream.expect_response().await;
}

#[tokio::test]
async fn a_request_larger_than_the_limit_is_refused_unread() {
    let harness = harness_with(StreamLimits {
        request_bytes: 4096,
        ..StreamLimits::default()
    })
    .await;
    let (token, _) = harness.token_for("default", "web-1");
    let names: Vec<String> = (0..100).map(|i| format!("name-{i:060}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let first = first_request("default.web-1", &names);
    let status = match Sotw::open(harness.unix_channel().await, Some(&token), first).await {
        Err(status) => status,
        Ok(mut stream) => stream.recv().await.expect_err("refused"),
    };
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_proxy_cannot_subscribe_to_more_names_than_its_limit_over_its_streams() {
    let harness = harness_with(StreamLimits {
        names_per_proxy: 4,
        ..StreamLimits::default()
    })
    .await;
    let (token, _) = harness.token_for("default", "web-1");
    let first = first_request("default.web-1", &["default", "a", "b"]);
    let mut one = Sotw::open(harness.unix_channel().await, Some(&token), first)
        .await
        .expect("authenticated");
    one.expect_response().await;
    let first = first_request("default.web-1", &["default", "c"]);
    let mut two = Sotw::open(harness.unix_channel().await, Some(&token), first)
        .await
        .expect("authenticated");
    let status = two.recv().await.expect_err("five names in all");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("limits.namesPerProxy"),
        "{status:?}"
    );
    let first = first_request("default.web-1", &["default"]);
    let mut three = Sotw::open(harness.unix_channel().await, Some(&token), first)
        .await
        .expect("authenticated");
    three.expect_response().await;
}
