//! The daemon under hostile input, driven as an attacker would: through its sockets, with or without
//! a token. Each test names the limit that stops the attack (SECURITY.md lists them all).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use common::{Env, DATAPLANE_WEB_1, MESH_BUILTIN, TIMEOUT};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use meshca_sds::{SdsClient, SECRET_TYPE_URL};
use tokio_stream::wrappers::ReceiverStream;

/// Idle memory of a debug build is a few tens of MiB; the attacks below pushed it past 1 GiB.
const RSS_CEILING_MIB: u64 = 200;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn mesh_env(settings: &str) -> Env {
    let env = Env::with_settings(settings);
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    env
}

/// Reads until the peer closes; `false` if it was still open after [`TIMEOUT`].
fn closed_by_peer(stream: &mut impl Read) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) => {
                return !matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

#[test]
fn continuation_frames_without_end_cannot_grow_memory_on_the_unix_socket() {
    let env = mesh_env("");
    let daemon = env.start();
    let mut socket = UnixStream::connect(env.data.join("sds.sock")).expect("connect");
    let mut start = PREFACE.to_vec();
    start.extend(frame(0x4, 0, 0, &[]));
    start.extend(frame(0x1, 0, 1, &[0x82; 64]));
    socket.write_all(&start).expect("the preface is read");
    let continuation = frame(0x9, 0, 1, &[0x82; 16 * 1024]);
    let mut written = 0usize;
    while written < 512 * 1024 * 1024 {
        if socket.write_all(&continuation).is_err() {
            break;
        }
        written += continuation.len();
    }
    assert!(
        written < 8 * 1024 * 1024,
        "the daemon read {written} bytes of one header block before closing the connection"
    );
    let rss = daemon.rss_mib();
    assert!(rss < RSS_CEILING_MIB, "RSS {rss} MiB");
}

#[test]
fn silent_connections_are_closed_on_every_listener() {
    let env = mesh_env("limits: {connectTimeout: 1s}\n");
    let daemon = env.start();
    let mut unix = UnixStream::connect(env.data.join("sds.sock")).expect("connect");
    unix.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    let mut tcp = TcpStream::connect(env.sds_tcp).expect("connect");
    tcp.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    // An admin request whose head never ends.
    let mut admin = TcpStream::connect(env.admin).expect("connect");
    admin
        .write_all(b"GET /ready HTTP/1.1\r\nHost: meshca\r\nX-Slow: ")
        .expect("write");
    admin.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    assert!(
        closed_by_peer(&mut unix),
        "the unix listener keeps a silent connection"
    );
    assert!(
        closed_by_peer(&mut tcp),
        "the TLS listener keeps a silent connection"
    );
    assert!(
        closed_by_peer(&mut admin),
        "the admin API keeps an unfinished request"
    );
    // The daemon says so, naming the listener: the client only sees its connection end (on the TLS
    // listener, which never finished its handshake).
    let log = daemon.log();
    let said = |listener: &str| {
        log.lines().any(|line| {
            line.contains("SDS listener closed a connection")
                && line.contains("within 1s of being accepted (limits.connectTimeout)")
                && line.contains(listener)
        })
    };
    let socket = env.data.join("sds.sock");
    assert!(said(&socket.display().to_string()), "{log}");
    assert!(said(&env.sds_tcp.to_string()), "{log}");
}

#[test]
fn a_listener_at_its_connection_limit_sheds_and_says_so() {
    let env = mesh_env("limits: {sdsConnections: 2, adminConnections: 2}\n");
    let daemon = env.start();
    let held: Vec<UnixStream> = (0..2)
        .map(|_| UnixStream::connect(env.data.join("sds.sock")).expect("connect"))
        .collect();
    let mut third = UnixStream::connect(env.data.join("sds.sock")).expect("the kernel accepts");
    third.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    assert!(closed_by_peer(&mut third), "a third connection is served");
    // The other SDS listener and the admin API have their own limits.
    let token = env.token("default", "web-1", &[]);
    let file = token.file.to_str().expect("UTF-8");
    let server = env.sds_tcp.to_string();
    env.cli(&[
        "sds",
        "fetch",
        "--config",
        env.cfg(),
        "--server",
        &server,
        "--token-file",
        file,
        "default",
    ])
    .ok();
    let metrics = daemon.admin_get("/metrics").body;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("meshca_sds_connections_shed_total 1")),
        "{metrics}"
    );
    assert!(
        daemon.log().contains("limits.sdsConnections"),
        "{}",
        daemon.log()
    );
    drop(held);
}

/// A stream held open.
struct Open {
    _requests: tokio::sync::mpsc::Sender<DiscoveryRequest>,
    _responses: tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
}

/// Opens a state-of-the-world stream asking for `names` and returns the first response's resource
/// count with the stream (held open while kept), or the refusal.
async fn ask(
    client: &SdsClient,
    node: &str,
    names: Vec<String>,
) -> Result<(usize, Open), tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: node.to_owned(),
            ..Default::default()
        }),
        resource_names: names,
        type_url: SECRET_TYPE_URL.to_owned(),
        ..Default::default()
    })
    .await
    .expect("queued");
    let mut call = tonic::Request::new(ReceiverStream::new(rx));
    client.authorize(&mut call);
    let mut stream = client.raw().stream_secrets(call).await?.into_inner();
    let first = stream.message().await?;
    let served = first.map_or(0, |response| response.resources.len());
    Ok((
        served,
        Open {
            _requests: tx,
            _responses: stream,
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_cannot_exhaust_memory_with_subscriptions() {
    let env = mesh_env("");
    let daemon = tokio::task::block_in_place(|| env.start());
    let token = tokio::task::block_in_place(|| env.token("default", "web-1", &[]));
    let client = SdsClient::connect(&env.sds_unix(), None, token.token.clone())
        .await
        .expect("connect");
    // What took the daemon past 1 GiB: 60 streams asking for 18,000 names of 200 characters.
    // With `default` among them, so that a daemon that accepted the request would answer it.
    let mut huge: Vec<String> = (0..18_000).map(|i| format!("{i:0200}")).collect();
    huge.push("default".to_owned());
    let mut refused = 0;
    for _ in 0..60 {
        match ask(&client, "default.web-1", huge.clone()).await {
            Ok((served, _)) => panic!("a stream of 18,000 names was served ({served} resources)"),
            Err(_) => refused += 1,
        }
    }
    assert_eq!(refused, 60);
    // Within the per-stream limits, names add up over the proxy's open streams until refused.
    let many = |stream: usize| -> Vec<String> {
        let mut names: Vec<String> = (0..255).map(|i| format!("s{stream}-{i:0300}")).collect();
        names.push("default".to_owned());
        names
    };
    let mut held = Vec::new();
    let mut over = None;
    for stream in 0..20 {
        match ask(&client, "default.web-1", many(stream)).await {
            Ok((_, open)) => held.push(open),
            Err(status) => {
                over = Some(status);
                break;
            }
        }
    }
    assert_eq!(held.len(), 16, "4096 names in 16 streams of 256");
    let over = over.expect("the per-proxy name total is reached");
    assert!(over.message().contains("limits.namesPerProxy"), "{over:?}");
    let rss = daemon.rss_mib();
    assert!(rss < RSS_CEILING_MIB, "RSS {rss} MiB");
    let streams = daemon.admin_get("/api/streams").body;
    assert!(streams.len() < 4 * 1024 * 1024, "{} bytes", streams.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_cannot_flood_or_forge_the_log() {
    let env = mesh_env("");
    // A log file, not a terminal: no colour codes, whatever NO_COLOR says.
    let daemon = tokio::task::block_in_place(|| {
        env.start_with(|cmd| {
            cmd.env_remove("NO_COLOR");
        })
    });
    let token = tokio::task::block_in_place(|| env.token("default", "web-1", &[]));
    let client = SdsClient::connect(&env.sds_unix(), None, token.token.clone())
        .await
        .expect("connect");
    let mut names: Vec<String> = (0..50).map(|i| format!("unknown-{i}")).collect();
    names.insert(0, "forged\nINFO meshca: all good \u{1b}[31mred".to_owned());
    names.push("default".to_owned());
    let (served, first) = ask(&client, "default.web-1", names).await.expect("served");
    assert_eq!(served, 1, "only `default` exists");
    drop(first);
    // Reconnecting does not buy a fresh budget.
    for round in 0..5 {
        let names = vec![format!("again-{round}"), "default".to_owned()];
        let (_, open) = ask(&client, "default.web-1", names).await.expect("served");
        drop(open);
    }
    // Without a token: every request is refused, and the log says so a few times a minute.
    let stranger = SdsClient::connect(&env.sds_unix(), None, "not-a-token".to_owned())
        .await
        .expect("connect");
    for _ in 0..30 {
        let refused = ask(&stranger, "default.web-1", vec!["default".to_owned()]).await;
        assert!(
            refused.is_err(),
            "a request without a valid token was served"
        );
    }
    let log = daemon.raw_log();
    let refusals = log.matches("SDS request refused").count();
    assert_eq!(
        refusals, 10,
        "refusals are logged within the budget:\n{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes or a forged escape in a log file:\n{log}"
    );
    assert!(
        !log.contains("\nINFO meshca: all good"),
        "a forged line:\n{log}"
    );
    let warned = log.matches("unknown secret name").count();
    assert_eq!(
        warned, 10,
        "one proxy's warnings are limited to limits.warningsPerMinute (10):\n{log}"
    );
}

#[test]
fn an_admin_api_beyond_loopback_is_a_loud_warning() {
    let env = mesh_env("");
    let port = env.admin.port();
    let daemon = env.start_with(|cmd| {
        cmd.env("MESHCA_ADMIN_LISTEN", format!("0.0.0.0:{port}"));
    });
    let log = daemon.log();
    assert!(
        log.contains("WARN") && log.contains("the admin API listens beyond loopback"),
        "{log}"
    );
}

#[test]
fn a_fifo_or_a_deeply_nested_file_is_rejected_and_the_daemon_keeps_serving() {
    let env = mesh_env("");
    let daemon = env.start();
    let fifo = env.root().join("ca.pem");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    // A provided CA read from a FIFO no one writes to: it used to hang the control loop forever.
    env.write_resource(
        "other.yaml",
        &format!(
            "type: Mesh\nname: other\nmtls:\n  enabledBackend: ext\n  backends:\n    - name: ext\n      type: provided\n      conf:\n        cert: {{file: {fifo}}}\n        key: {{file: {fifo}}}\n",
            fifo = fifo.display()
        ),
    );
    let rejected = daemon.wait_json("/api/rejected-update", "the FIFO to be refused", |v| {
        (!v.is_null()).then(|| v.to_string())
    });
    assert!(rejected.contains("a FIFO"), "{rejected}");
    // Flow mappings nested 50,000 deep: refused before the YAML parser spends minutes on them.
    std::fs::remove_file(env.resources.join("other.yaml")).expect("remove");
    let deep = format!("{}{}", "{a: ".repeat(50_000), "}".repeat(50_000));
    env.write_resource("deep.yaml", &deep);
    daemon.wait_json("/api/rejected-update", "the deep file to be refused", |v| {
        v.to_string().contains("limits.yamlDepth").then_some(())
    });
    // Meanwhile the daemon serves, is ready, and stops when asked.
    let token = env.token("default", "web-1", &[]);
    assert!(env.fetch_identity(&token).contains("BEGIN CERTIFICATE"));
    assert_eq!(daemon.admin_get("/ready").status, 200);
    assert!(daemon.stop().success());
}

#[test]
fn a_huge_name_in_a_resource_file_is_not_echoed_whole() {
    let env = mesh_env("");
    let daemon = env.start();
    let name = "x".repeat(10_000);
    env.write_resource(
        "huge.yaml",
        &format!("type: Mesh\nname: {name}\nmtls: {{}}\n"),
    );
    let rejected = daemon.wait_json("/api/rejected-update", "the huge name to be refused", |v| {
        (!v.is_null()).then(|| v.to_string())
    });
    assert!(rejected.contains("10000 bytes long"), "{rejected:.500}");
    assert!(
        rejected.len() < 4_000,
        "{} bytes: {rejected:.500}",
        rejected.len()
    );
}

/// An HTTP/2 connection to the daemon's unix SDS socket, driven by a task of its own.
async fn h2_unix(env: &Env) -> h2::client::SendRequest<bytes::Bytes> {
    let io = tokio::net::UnixStream::connect(env.data.join("sds.sock"))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(io).await.expect("HTTP/2");
    tokio::spawn(connection);
    client
}

/// Starts a `FetchSecrets` call and sends the first 1,000 bytes of a message announced as 1 MiB; the
/// rest never comes. Returns the answer's `grpc-status` (from the headers of a trailers-only answer).
async fn fetch_with_a_body_that_never_ends(env: &Env, token: Option<&str>) -> String {
    let mut client = h2_unix(env).await;
    let mut request = http::Request::post(
        "http://localhost/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let (response, mut body) = client
        .send_request(request.body(()).expect("a request"), false)
        .expect("the stream opens");
    let mut start = vec![0, 0, 0x10, 0, 0];
    start.extend_from_slice(&[0x0a; 1000]);
    // Refused on its headers alone, a call may be answered and its stream closed before these bytes
    // go out: then they cannot be sent, which is the point. With a token they must go out.
    if let Err(error) = body.send_data(bytes::Bytes::from(start), false) {
        assert!(token.is_none(), "the first bytes are sent: {error}");
    }
    let response = tokio::time::timeout(common::TIMEOUT, response)
        .await
        .expect("answered while the request's body is still open")
        .expect("an HTTP/2 response");
    let status = response
        .headers()
        .get("grpc-status")
        .expect("a trailers-only gRPC answer");
    drop(body);
    status.to_str().expect("ASCII").to_owned()
}

/// No body is read before its stream's token is checked, for the unary method too: a `FetchSecrets`
/// without a token is refused on its headers, and one with a token waits for its body only as long
/// as a stream waits for its first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_secrets_checks_the_token_before_reading_the_body() {
    let env = mesh_env("");
    let daemon = tokio::task::block_in_place(|| env.start());
    let token = tokio::task::block_in_place(|| env.token("default", "web-1", &[]));
    assert_eq!(
        fetch_with_a_body_that_never_ends(&env, None).await,
        (tonic::Code::Unauthenticated as i32).to_string(),
        "refused on the headers"
    );
    assert_eq!(
        fetch_with_a_body_that_never_ends(&env, Some(&token.token)).await,
        (tonic::Code::DeadlineExceeded as i32).to_string(),
        "an unfinished body is given up on"
    );
    // Neither kept anything: a whole fetch still works.
    tokio::task::block_in_place(|| env.fetch_identity(&token));
    let rss = daemon.rss_mib();
    assert!(rss < RSS_CEILING_MIB, "RSS {rss} MiB");
}

/// What a delta stream keeps of the versions a proxy says it holds is bounded by the name limits,
/// not by the request size: 200 streams each claiming a 1 MB version keep none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_a_delta_stream_claims_to_hold_are_not_kept_whole() {
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    let env = mesh_env("");
    let daemon = tokio::task::block_in_place(|| env.start());
    let token = tokio::task::block_in_place(|| env.token("default", "web-1", &[]));
    let client = SdsClient::connect(&env.sds_unix(), None, token.token.clone())
        .await
        .expect("connect");
    let mut held = Vec::new();
    for _ in 0..200 {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(DeltaDiscoveryRequest {
            node: Some(Node {
                id: "default.web-1".to_owned(),
                ..Default::default()
            }),
            type_url: SECRET_TYPE_URL.to_owned(),
            resource_names_subscribe: vec!["default".to_owned()],
            // A name the stream never subscribes to: no response ever replaces what it claims.
            initial_resource_versions: [("held-elsewhere".to_owned(), "v".repeat(1_000_000))]
                .into(),
            ..Default::default()
        })
        .await
        .expect("queued");
        let mut call = tonic::Request::new(ReceiverStream::new(rx));
        client.authorize(&mut call);
        let mut stream = client
            .raw()
            .delta_secrets(call)
            .await
            .expect("the stream opens")
            .into_inner();
        let first = stream
            .message()
            .await
            .expect("a response")
            .expect("not ended");
        assert_eq!(first.resources.len(), 1, "the identity is sent");
        held.push((tx, stream));
    }
    let rss = daemon.rss_mib();
    assert!(rss < RSS_CEILING_MIB, "RSS {rss} MiB with 200 streams open");
}

/// Admin clients that ask and never read what comes back are disconnected once a response has waited
/// `limits.connectTimeout` for them, so they cannot hold every admin slot.
#[test]
fn admin_clients_that_never_read_cannot_hold_the_admin_api() {
    let env = mesh_env("limits: {adminConnections: 4, connectTimeout: 1s}\n");
    let daemon = env.start();
    // Thousands of pipelined /metrics requests: far more response bytes than the sockets buffer.
    let requests = b"GET /metrics HTTP/1.1\r\nHost: meshca\r\n\r\n".repeat(4000);
    let held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut socket = TcpStream::connect(env.admin).expect("connect");
            socket
                .set_write_timeout(Some(std::time::Duration::from_secs(1)))
                .expect("a timeout");
            // Whatever the daemon takes before it stops reading.
            let _ = socket.write_all(&requests);
            socket
        })
        .collect();
    common::wait_for("the admin API to answer again", || {
        common::http_get(env.admin, "/ready")
            .ok()
            .filter(|r| r.status == 200)
    });
    assert!(daemon.admin_get("/metrics").body.contains("meshca_"));
    let status = env.cli(&["status", "--admin", &env.admin.to_string()]);
    assert_eq!(status.code(), Some(0), "{status}");
    drop(held);
}

/// A path the admin API does not know is echoed escaped and cut, never raw: no CR, LF or terminal
/// escape of a client's reaches a 404's body, and a long name is not returned whole.
#[test]
fn admin_404s_echo_the_path_escaped_and_cut() {
    let env = mesh_env("");
    let daemon = env.start();
    let long = "x".repeat(3000);
    for path in [
        format!("/api/dataplanes/default/%0D%0Ainjected%1B[31m{long}"),
        format!("/api/dataplanes/%0D%0Ainjected{long}/web-1"),
        format!("/api/meshes/%0D%0Ainjected%1B[31m{long}"),
    ] {
        let response = daemon.admin_get(&path);
        assert_eq!(response.status, 404, "{path}: {}", response.body);
        let body = response.body.trim_end_matches('\n');
        assert!(
            !body.contains(['\r', '\n', '\u{1b}']),
            "{path}: raw control characters echoed: {body:?}"
        );
        assert!(body.contains("injected"), "{path}: {body:?}");
        assert!(body.len() < 600, "{path}: {} bytes echoed", body.len());
    }
}

/// Only an authenticated stream keeps a connection past `limits.connectTimeout`: requests of every
/// method refused for want of a token, sent back to back, do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_do_not_keep_a_connection_open() {
    let env = mesh_env("limits: {connectTimeout: 1s}\n");
    let _daemon = tokio::task::block_in_place(|| env.start());
    let io = tokio::net::UnixStream::connect(env.data.join("sds.sock"))
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(io).await.expect("HTTP/2");
    let mut connection = tokio::spawn(connection);
    let refused = async {
        let mut answered = 0u64;
        loop {
            let method = ["StreamSecrets", "DeltaSecrets", "FetchSecrets"][answered as usize % 3];
            let request = http::Request::post(format!(
                "http://localhost/envoy.service.secret.v3.SecretDiscoveryService/{method}"
            ))
            .header("content-type", "application/grpc")
            .body(())
            .expect("a request");
            let Ok(ready) = client.clone().ready().await else {
                return answered;
            };
            client = ready;
            let Ok((response, _)) = client.send_request(request, true) else {
                return answered;
            };
            match response.await {
                Ok(_) => answered += 1,
                Err(_) => return answered,
            }
        }
    };
    let answered = tokio::time::timeout(common::TIMEOUT, refused)
        .await
        .expect("the daemon closes the connection at the connect timeout");
    assert!(answered > 0, "the refusals were answered first");
    let _ = tokio::time::timeout(common::TIMEOUT, &mut connection).await;
}

/// A connection that opens `streams` request streams and resets each before the server can accept
/// it (HTTP/2 "rapid reset"), in one write; returns once the server has closed the connection.
fn rapid_reset(socket: &std::path::Path, streams: u32) {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).expect("a timeout");
    let mut attack = PREFACE.to_vec();
    attack.extend(frame(0x4, 0, 0, &[]));
    // :method POST, :scheme http, :path /, :authority localhost (HPACK).
    let mut headers = vec![0x83, 0x86, 0x84, 0x41, 9];
    headers.extend_from_slice(b"localhost");
    for n in 0..streams {
        let id = 2 * n + 1;
        attack.extend(frame(0x1, 0x4, id, &headers));
        attack.extend(frame(0x3, 0, id, &8u32.to_be_bytes()));
    }
    // The server may close the connection before it read everything.
    let _ = stream.write_all(&attack);
    assert!(
        closed_by_peer(&mut stream),
        "a connection resetting {streams} streams was kept open"
    );
}

/// HTTP/2 rapid reset makes the HTTP/2 library write a warning for each connection before it sends
/// GOAWAY, before any token is read. Those warnings go through `limits.warningsPerMinute` (10) like
/// the daemon's own, on the SDS and the Workload API sockets alike; the rest are counted.
#[test]
fn rapid_resets_cannot_flood_the_log() {
    let env = mesh_env("");
    let daemon = env.start();
    let sockets = [env.data.join("sds.sock"), env.data.join("workload.sock")];
    for round in 0..30 {
        rapid_reset(&sockets[round % 2], 200);
    }
    let log = daemon.log();
    let written = log.matches("reached limit").count();
    assert!(
        (1..=10).contains(&written),
        "{written} warnings written for 30 connections:\n{log}"
    );
    let metrics = daemon.admin_get("/metrics").body;
    let suppressed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("meshca_library_log_lines_suppressed_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no suppressed count in\n{metrics}"));
    assert!(
        written as u64 + suppressed >= 30,
        "{written} written and {suppressed} counted for 30 connections:\n{log}"
    );
    // The daemon still serves.
    let token = env.token("default", "web-1", &[]);
    env.fetch_identity(&token);
}
