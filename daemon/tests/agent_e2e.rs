//! A daemon and a `meshca agent` together, both in this process: a workload on the agent's socket gets
//! an SVID over a key the agent made, the server side holds that key nowhere, a CA rotation reaches the
//! workload's bundle before its SVID moves to the new CA, and the agent keeps serving while the server
//! is down, then catches up when it returns.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use meshca_agent::{Agent, AgentConfig, ServerAddr};
use meshca_config::{ListenAddr, Settings};
use meshca_daemon::{Daemon, DaemonOptions};
use meshca_workload::proto::{paths, X509SvidRequest, X509SvidResponse};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Streaming};
use tonic_prost::ProstCodec;

/// How long any one step may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// How long the agent gives a workload to apply a message before it counts as applied.
const ACK_AFTER: Duration = Duration::from_secs(1);

/// A legacy mesh whose builtin backend `enabled` issues, trusting `also` too.
fn mesh(enabled: &str, also: &[&str]) -> String {
    let mut backends = String::new();
    for name in std::iter::once(enabled).chain(also.iter().copied()) {
        backends.push_str(&format!(
            "    - {{name: {name}, type: builtin, dpCert: {{rotation: {{expiration: 1h}}}}}}\n"
        ));
    }
    let secondary = if also.is_empty() {
        String::new()
    } else {
        format!("  secondaryBackends: [{}]\n", also.join(", "))
    };
    format!("type: Mesh\nname: default\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

fn workloads(uid: &str) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: batch-1\nnetworking:\n  address: 10.0.0.1\n  inbound: \
         [{{port: 8080, tags: {{kuma.io/service: batch}}}}]\n---\ntype: WorkloadRegistration\nmesh: \
         default\nname: batch\nspec:\n  dataplane: batch-1\n  selectors: [unix:uid:{uid}]\n  agent: \
         host-a\n"
    )
}

fn my_uid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("an effective uid")
        .to_owned()
}

async fn start_daemon(root: &Path) -> Daemon {
    let mut settings = Settings {
        data_dir: root.join("data"),
        resources: root.join("resources"),
        ..Settings::default()
    };
    settings.sds.listen = vec![ListenAddr::Unix(root.join("sds.sock"))];
    settings.sds.tls = None;
    settings.admin.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    settings.workload_api.listen = Vec::new();
    let options = DaemonOptions {
        gate: true,
        watch_files: false,
    };
    tokio::time::timeout(TIMEOUT, Daemon::start(settings, options))
        .await
        .expect("starts in time")
        .expect("the daemon starts")
}

async fn reload(daemon: &Daemon) {
    let outcome = daemon.reload_resources().await.expect("the daemon runs");
    if let Err(errors) = outcome {
        panic!("the update was rejected: {errors:?}");
    }
}

async fn x509_stream(socket: &Path) -> Streaming<X509SvidResponse> {
    let channel: Channel =
        meshca_sds::connect_channel(&format!("unix://{}", socket.display()), None)
            .await
            .expect("connects to the agent's socket");
    let mut grpc = tonic::client::Grpc::new(channel);
    let mut request = Request::new(X509SvidRequest {});
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("ascii"));
    grpc.ready().await.expect("ready");
    grpc.server_streaming(
        request,
        paths::FETCH_X509_SVID.parse().expect("a path"),
        ProstCodec::default(),
    )
    .await
    .expect("the stream opens")
    .into_inner()
}

async fn next(stream: &mut Streaming<X509SvidResponse>) -> X509SvidResponse {
    tokio::time::timeout(TIMEOUT, stream.message())
        .await
        .expect("a message in time")
        .expect("the stream stays open")
        .expect("a message")
}

/// The subjects of the CAs in a concatenated DER bundle.
fn ca_subjects(bundle: &[u8]) -> BTreeSet<String> {
    let mut rest = bundle;
    let mut subjects = BTreeSet::new();
    while !rest.is_empty() {
        let (after, cert) = x509_parser::parse_x509_certificate(rest).expect("a CA certificate");
        subjects.insert(cert.subject().to_string());
        rest = after;
    }
    subjects
}

/// The leaf's issuer, and whether the key sent with it is the leaf's.
fn leaf_issuer(response: &X509SvidResponse) -> String {
    let svid = &response.svids[0];
    let (_, leaf) = x509_parser::parse_x509_certificate(&svid.x509_svid).expect("the leaf parses");
    let key = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &svid.x509_svid_key,
        &ring::rand::SystemRandom::new(),
    )
    .expect("the key is PKCS#8 P-256");
    use ring::signature::KeyPair;
    assert_eq!(
        key.public_key().as_ref(),
        leaf.public_key().subject_public_key.data.as_ref(),
        "the key is the leaf's"
    );
    leaf.issuer().to_string()
}

/// Every file under `dir`, read whole.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.is_file() {
                out.push((path.clone(), std::fs::read(&path).expect("a readable file")));
            }
        }
    }
    out
}

async fn admin_text(admin: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin)
        .await
        .expect("admin connects");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response}");
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_behind_an_agent_gets_its_identity_over_a_key_the_server_never_holds() {
    let root = tempfile::tempdir().expect("a temp dir");
    let resources = root.path().join("resources");
    std::fs::create_dir(&resources).expect("resources dir");
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-1", &[])).expect("mesh.yaml");
    std::fs::write(resources.join("workloads.yaml"), workloads(&my_uid())).expect("workloads");
    let daemon = start_daemon(root.path()).await;

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let claims =
        meshca_auth::Claims::new_agent("host-a", Duration::from_secs(3600), now).expect("claims");
    let token_file = root.path().join("agent.token");
    std::fs::write(&token_file, daemon.mint_token(&claims).expect("a token")).expect("token");
    let mut config = AgentConfig::new(
        vec![ServerAddr::Unix(root.path().join("sds.sock"))],
        token_file,
    );
    let agent_socket = root.path().join("agent.sock");
    config.listen = agent_socket.clone();
    config.admin = None;
    config.workload.ack_after = ACK_AFTER;
    config.backoff = (Duration::from_millis(20), Duration::from_millis(200));
    let shutdown = CancellationToken::new();
    let agent = Agent::start(config, shutdown.clone())
        .await
        .expect("the agent starts");

    // The workload gets the dataplane's identity, over a key the agent made.
    let mut svids = x509_stream(&agent_socket).await;
    let first = next(&mut svids).await;
    assert_eq!(first.svids.len(), 1);
    assert_eq!(first.svids[0].spiffe_id, "spiffe://default/batch");
    let old_issuer = leaf_issuer(&first);
    let old_cas = ca_subjects(&first.svids[0].bundle);
    assert!(old_cas.contains(&old_issuer), "the bundle holds its issuer");

    // The key is nowhere on the server's side: not in its data directory, not in its admin API.
    // A P-256 PKCS#8 key (as ring writes it) begins with 36 bytes every such key shares; the private
    // scalar follows. Its bytes, and the PEM text that encodes them (base64 from the 48th character:
    // 36 bytes are 48 characters), are what must not appear.
    let key = first.svids[0].x509_svid_key.clone();
    let secret = &key[36..68];
    let key_b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    let key_body = &key_b64[48..88];
    for (path, content) in files_under(&root.path().join("data")) {
        assert!(
            !content.windows(secret.len()).any(|w| w == secret),
            "{} holds the workload's key",
            path.display()
        );
        assert!(
            !String::from_utf8_lossy(&content).contains(key_body),
            "{} holds the workload's key as PEM",
            path.display()
        );
    }
    for path in [
        "/api/status",
        "/api/agents",
        "/api/dataplanes",
        "/api/dataplanes/default/batch-1",
        "/api/streams",
    ] {
        let text = admin_text(daemon.admin_addr, path).await;
        assert!(!text.contains(key_body), "{path} shows the workload's key");
    }
    let agents = admin_text(daemon.admin_addr, "/api/agents").await;
    assert!(agents.contains("host-a"), "{agents}");

    // A CA rotation: the workload's bundle holds the new CA before its SVID comes from it.
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-2", &["ca-1"])).expect("mesh.yaml");
    reload(&daemon).await;
    // The agent acknowledges a state only once its streams have had `ackAfter` to apply it, and the
    // server issues from the new CA only once the agent acknowledged its trust: so the SVID comes at
    // least `ackAfter` after the agent sent the bundle that holds its CA. This test reads the bundle
    // some time after it was sent; half of `ackAfter` is the margin left for that. (Without the gate
    // the SVID follows within milliseconds.)
    let mut bundle = old_cas.clone();
    let mut bundle_since = tokio::time::Instant::now();
    loop {
        let message = next(&mut svids).await;
        let issuer = leaf_issuer(&message);
        if issuer != old_issuer {
            assert!(
                bundle.contains(&issuer),
                "the SVID from {issuer} came before a bundle with its CA (bundle held {bundle:?})"
            );
            assert!(
                bundle_since.elapsed() >= ACK_AFTER / 2,
                "the SVID from the new CA came {:?} after the bundle with it, before the agent \
                 could have acknowledged that bundle",
                bundle_since.elapsed()
            );
            assert!(ca_subjects(&message.svids[0].bundle).contains(&issuer));
            break;
        }
        let cas = ca_subjects(&message.svids[0].bundle);
        if cas != bundle {
            bundle = cas;
            bundle_since = tokio::time::Instant::now();
        }
    }
    assert!(
        bundle.len() > old_cas.len(),
        "the new CA came in a message of its own first"
    );

    // The server goes away: the agent keeps serving what it holds, to a new stream too.
    daemon.stop().await;
    let mut again = x509_stream(&agent_socket).await;
    let held = next(&mut again).await;
    assert_eq!(held.svids[0].spiffe_id, "spiffe://default/batch");

    // The server comes back on the same data directory; the agent reconnects, and a rotation that
    // drops the old CA reaches the workload.
    let daemon = start_daemon(root.path()).await;
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-2", &[])).expect("mesh.yaml");
    reload(&daemon).await;
    loop {
        let message = next(&mut again).await;
        let cas = ca_subjects(&message.svids[0].bundle);
        if !cas.contains(&old_issuer) {
            assert_ne!(leaf_issuer(&message), old_issuer);
            break;
        }
    }
    shutdown.cancel();
    agent.wait().await;
    daemon.stop().await;
}
