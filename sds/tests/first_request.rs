//! How long a stream waits for its first request. A client that sends nothing (a slow loris) to a server
//! with time on its hands is closed after one identity wait. A client whose request queues behind its
//! connection's other streams (HTTP/2 flow control holds it while a busy server reads and answers the
//! others) is not, as long as its connection keeps carrying data; nor is one whose request is late while
//! the server is busy (its load clock is the test's: CPU time, or its runtime's workers awake with
//! work): each waits up to four identity waits.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use meshca_sds::SECRET_TYPE_URL;
use meshca_serve::{HubOptions, Load};
use prost::Message as _;

const WAIT: Duration = Duration::from_millis(300);

/// How long an answer may take before the test fails.
const TIMEOUT: Duration = Duration::from_secs(30);

const STREAM_SECRETS: &str =
    "http://localhost/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";

/// A server with time on its hands: its load clock never moves.
fn idle() -> Load {
    Load::default()
}

/// A server that is always busy on the cores: an hour of CPU time passes between any two readings.
fn busy_on_the_cores() -> Load {
    static NOW: AtomicU64 = AtomicU64::new(0);
    Load {
        cpu: Duration::from_secs(NOW.fetch_add(3600, Ordering::Relaxed)),
        runtime_busy: Duration::ZERO,
    }
}

/// A server starved of the cores: it spends no CPU time, but its workers are awake with work for an
/// hour between any two readings.
fn busy_but_starved() -> Load {
    static NOW: AtomicU64 = AtomicU64::new(0);
    Load {
        cpu: Duration::ZERO,
        runtime_busy: Duration::from_secs(NOW.fetch_add(3600, Ordering::Relaxed)),
    }
}

async fn harness() -> Harness {
    harness_with(idle).await
}

async fn harness_with(load_clock: fn() -> Load) -> Harness {
    Harness::start_with(
        HubOptions::default()
            .with_identity_wait(WAIT)
            .with_load_clock(load_clock),
        World::new().snapshot(1),
    )
    .await
}

/// A raw HTTP/2 client on the harness's unix socket: streams whose bytes the test sends itself.
async fn h2_client(harness: &Harness) -> h2::client::SendRequest<Bytes> {
    let path = harness
        .unix_target
        .strip_prefix("unix://")
        .expect("a unix target");
    let io = tokio::net::UnixStream::connect(path)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(io).await.expect("HTTP/2");
    tokio::spawn(connection);
    client
}

/// A gRPC message frame.
fn framed(message: &DiscoveryRequest) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// A request of web-1's, over 16 KiB with Envoy's list of extensions in its node.
fn large_request() -> DiscoveryRequest {
    let extensions = (0..400)
        .map(|i| Extension {
            name: format!("envoy.filters.http.simulated_extension_{i:04}"),
            category: "envoy.filters.http".into(),
            ..Default::default()
        })
        .collect();
    let request = DiscoveryRequest {
        node: Some(Node {
            id: "default.web-1".into(),
            extensions,
            ..Default::default()
        }),
        resource_names: vec!["system_trust_bundle".into()],
        type_url: SECRET_TYPE_URL.into(),
        ..Default::default()
    };
    assert!(request.encoded_len() > 16 * 1024);
    request
}

/// Opens a `StreamSecrets` stream of web-1 without sending any of its body.
fn open(
    client: &mut h2::client::SendRequest<Bytes>,
    token: &str,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let request = http::Request::post(STREAM_SECRETS)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("a request");
    client
        .send_request(request, false)
        .expect("the stream opens")
}

/// The `grpc-status` and `grpc-message` a stream ended with: from the headers of a trailers-only answer,
/// or from its trailers after its messages.
async fn ended_with(response: h2::client::ResponseFuture) -> (String, String) {
    let response = tokio::time::timeout(TIMEOUT, response)
        .await
        .expect("answered")
        .expect("an HTTP/2 response");
    let pick = |headers: &http::HeaderMap| {
        headers.get("grpc-status").map(|s| {
            let message = headers
                .get("grpc-message")
                .map(|m| m.to_str().expect("ASCII").to_owned())
                .unwrap_or_default();
            (s.to_str().expect("ASCII").to_owned(), message)
        })
    };
    if let Some(status) = pick(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data.expect("the body");
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await.expect("trailers").expect("trailers");
    pick(&trailers).expect("a grpc-status trailer")
}

const DEADLINE_EXCEEDED: &str = "4";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_asks_on_a_quiet_connection_is_closed_after_one_wait() {
    let harness = harness().await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut client = h2_client(&harness).await;
    let (response, _body) = open(&mut client, &token);
    let (status, message) = ended_with(response).await;
    assert_eq!(status, DEADLINE_EXCEEDED, "{message}");
    assert!(message.contains("300ms"), "one wait: {message}");
}

/// The late stream of web-1 sends its first request now, and is answered with messages (not refused
/// with a trailers-only answer).
async fn asks_and_is_answered(
    late: h2::client::ResponseFuture,
    body: &mut h2::SendStream<Bytes>,
) -> http::Response<h2::RecvStream> {
    body.send_data(framed(&first_request("default.web-1", &["default"])), false)
        .expect("the late stream is still open");
    let response = tokio::time::timeout(TIMEOUT, late)
        .await
        .expect("answered")
        .expect("an HTTP/2 response");
    assert_eq!(response.status(), 200);
    assert!(
        response.headers().get("grpc-status").is_none(),
        "not a trailers-only refusal: {:?}",
        response.headers()
    );
    response
}

/// While the server is busy, a stream's request may be on its way however quiet its connection: it
/// waits up to four waits, as the progress of its connection would let it, and is closed after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_server_is_busy_a_stream_waits_four_waits_for_its_first_request() {
    busy_server_waits_four_waits(busy_on_the_cores).await;
}

/// The same when the server is busy but starved of the cores: little CPU time, its workers never idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_server_is_starved_a_stream_waits_four_waits_for_its_first_request() {
    busy_server_waits_four_waits(busy_but_starved).await;
}

async fn busy_server_waits_four_waits(load_clock: fn() -> Load) {
    let harness = harness_with(load_clock).await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut client = h2_client(&harness).await;
    let (late, mut late_body) = open(&mut client, &token);
    let opened = Instant::now();
    // Two waits on, on a connection that carried nothing meanwhile, the request comes and is answered.
    tokio::time::sleep_until((opened + WAIT * 2).into()).await;
    asks_and_is_answered(late, &mut late_body).await;
    // One that never asks is still closed, after four waits.
    let (never, _never_body) = open(&mut client, &token);
    let (status, message) = ended_with(never).await;
    assert_eq!(status, DEADLINE_EXCEEDED, "{message}");
    assert!(message.contains("1.2s"), "four waits: {message}");
}

/// Sends web-1's large request on `body` until `until` passes, each as flow control lets it go.
async fn keep_sending(body: &mut h2::SendStream<Bytes>, until: Instant) {
    let request = framed(&large_request());
    while Instant::now() < until {
        body.reserve_capacity(request.len());
        let mut left = request.clone();
        while !left.is_empty() {
            let capacity = std::future::poll_fn(|cx| body.poll_capacity(cx))
                .await
                .expect("capacity")
                .expect("the stream is open");
            let chunk = left.split_to(capacity.min(left.len()));
            body.send_data(chunk, false).expect("sent");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_behind_a_busy_connection_waits_while_the_connection_is_busy() {
    let harness = harness().await;
    let (token, _) = harness.token_for("default", "web-1");
    let mut client = h2_client(&harness).await;
    // The stream whose request is late, and a busy one on the same connection.
    let (late, mut late_body) = open(&mut client, &token);
    let opened = Instant::now();
    let (busy, mut busy_body) = open(&mut client, &token);
    let busy = tokio::spawn(ended_with(busy));
    keep_sending(&mut busy_body, opened + WAIT * 2).await;
    // Two waits on, the late stream asks and is answered.
    let mut response = asks_and_is_answered(late, &mut late_body).await;
    let first = response
        .body_mut()
        .data()
        .await
        .expect("a message")
        .expect("the body");
    assert!(first.len() > 5, "a response message");

    // One that never asks is closed after four waits however busy its connection is.
    let (never, _never_body) = open(&mut client, &token);
    let opened = Instant::now();
    let ended = tokio::spawn(ended_with(never));
    keep_sending(&mut busy_body, opened + WAIT * 5).await;
    let (status, message) = ended.await.expect("joined");
    assert_eq!(status, DEADLINE_EXCEEDED, "{message}");
    assert!(message.contains("1.2s"), "four waits: {message}");
    busy.abort();
}
