//! A client that stops answering the HTTP/2 keepalive ping is closed by the server, and the daemon says
//! so: the connection is counted, where before its end was silent on the daemon's side.

use std::sync::Arc;
use std::time::Duration;

use meshca_serve::{bind, ConnPolicy, Keepalive, Listener, StreamLimits, StreamMetrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

/// HTTP/2's client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
const PING: u8 = 6;
const GOAWAY: u8 = 7;

/// The types of the HTTP/2 frames in `bytes`, in order.
fn frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

#[tokio::test]
async fn a_client_that_stops_answering_pings_is_closed_and_counted() {
    let dir = tempfile::tempdir().expect("a directory");
    let socket = dir.path().join("sds.sock");
    let bound = bind(vec![Listener::Unix(socket.clone())])
        .await
        .expect("bind");
    let metrics = Arc::new(StreamMetrics::default());
    let keepalive = Keepalive {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(100),
    };
    // The connect timeout (10 s) is far longer: if the keepalive did not close the connection, that
    // deadline would, and it would not be counted as the keepalive's.
    let policy = ConnPolicy::new("SDS", "limits.sdsConnections", StreamLimits::default())
        .with_metrics(metrics.clone())
        .with_keepalive(keepalive);
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(bound.serve_service(
        tonic::service::Routes::default(),
        policy,
        || {},
        shutdown.clone(),
    ));

    let mut client = UnixStream::connect(&socket).await.expect("connect");
    client.write_all(PREFACE).await.expect("the preface");
    client.write_all(&SETTINGS).await.expect("settings");
    // The client reads everything the server sends and answers nothing, until the server closes.
    let mut received = Vec::new();
    client
        .read_to_end(&mut received)
        .await
        .expect("read until the server closed");
    let types = frame_types(&received);
    assert!(types.contains(&PING), "the server pinged: {types:?}");
    assert_eq!(types.last(), Some(&GOAWAY), "then went away: {types:?}");
    assert_eq!(
        StreamMetrics::get(&metrics.connections_keepalive_closed),
        1,
        "the close was counted as the keepalive's"
    );

    shutdown.cancel();
    served
        .await
        .expect("the server task")
        .expect("the server ended cleanly");
}
