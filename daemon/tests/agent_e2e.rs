//! A daemon and `meshca agent`s together, all in this process: a workload on an agent's socket gets
//! an SVID over a key the agent made, the server side holds that key nowhere (data directory, admin
//! API, and the database dump of replicas on PostgreSQL), a CA rotation reaches the workload's bundle
//! before its SVID moves to the new CA, the agent keeps serving while the server is down and catches up
//! when it returns, a revoked agent token gets no new certificate while the agent keeps serving what
//! it holds, and an agent moves from a stopped replica to another that serves its workload on until
//! its token is revoked through the database.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use meshca_agent::{Agent, AgentConfig, ServerAddr};
use meshca_auth::Claims;
use meshca_config::{
    KeystoreSettings, KeystoreType, ListenAddr, PostgresSettings, ReplicaSettings, Settings,
};
use meshca_control::DataplaneStatus;
use meshca_daemon::revocations::{self, Revoked};
use meshca_daemon::{Daemon, DaemonOptions};
use meshca_testpg::TestPostgres;
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

/// Dataplane `dataplane` of service `service`, and the WorkloadRegistration (named after the service)
/// that agent `agent` serves it through to processes of `uid`.
fn registration(agent: &str, dataplane: &str, service: &str, address: &str, uid: &str) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: {dataplane}\nnetworking:\n  address: {address}\n  inbound: \
         [{{port: 8080, tags: {{kuma.io/service: {service}}}}}]\n---\ntype: WorkloadRegistration\nmesh: \
         default\nname: {service}\nspec:\n  dataplane: {dataplane}\n  selectors: [unix:uid:{uid}]\n  agent: \
         {agent}\n"
    )
}

/// Host `host-a`'s workload: dataplane `batch-1`, `spiffe://default/batch`.
fn workloads(uid: &str) -> String {
    registration("host-a", "batch-1", "batch", "10.0.0.1", uid)
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

/// A daemon's settings in `root`: SDS on `root/sds.sock`, the admin API on a free loopback port.
fn settings(root: &Path) -> Settings {
    let mut settings = Settings {
        data_dir: root.join("data"),
        resources: root.join("resources"),
        ..Settings::default()
    };
    settings.sds.listen = vec![ListenAddr::Unix(root.join("sds.sock"))];
    settings.sds.tls = None;
    settings.admin.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    settings.workload_api.listen = Vec::new();
    settings
}

/// Starts a daemon; `watch_files` as `meshca serve` does (its resources directory and revocation
/// list), or not.
async fn start(settings: Settings, watch_files: bool) -> Daemon {
    let options = DaemonOptions {
        gate: true,
        watch_files,
    };
    tokio::time::timeout(TIMEOUT, Daemon::start(settings, options))
        .await
        .expect("starts in time")
        .expect("the daemon starts")
}

async fn start_daemon(root: &Path) -> Daemon {
    start(settings(root), false).await
}

/// The resources directory of a daemon in `root`, with mesh `default` on `ca-1` and `workloads`.
fn write_resources(root: &Path, workloads: &str) -> PathBuf {
    let resources = root.join("resources");
    std::fs::create_dir_all(&resources).expect("resources dir");
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-1", &[])).expect("mesh.yaml");
    std::fs::write(resources.join("workloads.yaml"), workloads).expect("workloads");
    resources
}

/// An agent started in this process, and what a test needs of it.
struct TestAgent {
    agent: Agent,
    /// Its Workload API socket.
    socket: PathBuf,
    /// Its token's claims (the id is what `meshca token --revoke` takes).
    claims: Claims,
    shutdown: CancellationToken,
}

impl TestAgent {
    /// Starts agent `name` with a token `minter` signs, serving on `root/<name>.sock` what `servers`
    /// send, trying the next server at most `retry` after one refused or failed it.
    async fn start(
        root: &Path,
        name: &str,
        servers: Vec<ServerAddr>,
        minter: &Daemon,
        retry: Duration,
    ) -> TestAgent {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let claims = Claims::new_agent(name, Duration::from_secs(3600), now).expect("claims");
        let token_file = root.join(format!("{name}.token"));
        std::fs::write(&token_file, minter.mint_token(&claims).expect("a token")).expect("token");
        let mut config = AgentConfig::new(servers, token_file);
        let socket = root.join(format!("{name}.sock"));
        config.listen = socket.clone();
        config.admin = None;
        config.workload.ack_after = ACK_AFTER;
        config.backoff = (Duration::from_millis(20), retry);
        let shutdown = CancellationToken::new();
        let agent = Agent::start(config, shutdown.clone())
            .await
            .expect("the agent starts");
        TestAgent {
            agent,
            socket,
            claims,
            shutdown,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.agent.wait().await;
    }
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

/// The leaf's DER: the first certificate of the SVID's chain.
fn leaf_der(response: &X509SvidResponse) -> Vec<u8> {
    let chain = &response.svids[0].x509_svid;
    let (rest, _) = x509_parser::parse_x509_certificate(chain).expect("the leaf parses");
    chain[..chain.len() - rest.len()].to_vec()
}

/// The forms stored bytes can hold a value in: the bytes themselves, lowercase hex (how pg_dump writes
/// a `bytea`), and base64 (PEM, or a value inside a longer PEM) at each of the three alignments the
/// value can have in it.
struct Traces {
    what: &'static str,
    raw: Vec<u8>,
    hex: String,
    base64: Vec<String>,
}

impl Traces {
    fn of(what: &'static str, value: &[u8]) -> Traces {
        // Whole base64 groups of the value from its first, second and third byte: one of them is in
        // the base64 of anything that holds the value, wherever it starts.
        let base64 = (0..3)
            .map(|skip| {
                let tail = &value[skip..];
                base64::engine::general_purpose::STANDARD.encode(&tail[..tail.len() / 3 * 3])
            })
            .collect();
        Traces {
            what,
            raw: value.to_vec(),
            hex: value.iter().map(|b| format!("{b:02x}")).collect(),
            base64,
        }
    }

    /// How `content` holds the value, if it does. Text is read without its line breaks, nor the `\n`
    /// escapes pg_dump writes for them: PEM breaks its base64 into lines.
    fn found_in(&self, content: &[u8]) -> Option<&'static str> {
        if content.windows(self.raw.len()).any(|w| w == self.raw) {
            return Some("as bytes");
        }
        let text = String::from_utf8_lossy(content)
            .replace("\\n", "")
            .replace("\\r", "")
            .replace(['\n', '\r'], "");
        if text.to_ascii_lowercase().contains(&self.hex) {
            return Some("in hex");
        }
        if self.base64.iter().any(|b| text.contains(b.as_str())) {
            return Some("in base64");
        }
        None
    }
}

/// What a workload's private key would leave where it is stored or shown: its PKCS#8 DER, and the
/// private scalar in it.
struct WorkloadKey([Traces; 2]);

impl WorkloadKey {
    /// The traces of `pkcs8`, a P-256 key as ring writes it: 36 bytes every such key shares (the last
    /// two open the 32-byte OCTET STRING), then the private scalar.
    fn of(pkcs8: &[u8]) -> WorkloadKey {
        assert_eq!(
            pkcs8.get(34..36),
            Some(&[0x04, 0x20][..]),
            "a P-256 PKCS#8 key"
        );
        WorkloadKey([
            Traces::of("its PKCS#8 DER", pkcs8),
            Traces::of("its private scalar", &pkcs8[36..68]),
        ])
    }

    fn assert_not_in(&self, place: &str, content: &[u8]) {
        for traces in &self.0 {
            if let Some(how) = traces.found_in(content) {
                panic!("{place} holds the workload's key: {} {how}", traces.what);
            }
        }
    }

    /// Every file under `dir` is scanned.
    fn assert_not_under(&self, dir: &Path) {
        for (path, content) in files_under(dir) {
            self.assert_not_in(&path.display().to_string(), &content);
        }
    }
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
    let resources = write_resources(root.path(), &workloads(&my_uid()));
    let daemon = start_daemon(root.path()).await;
    let agent = TestAgent::start(
        root.path(),
        "host-a",
        vec![ServerAddr::Unix(root.path().join("sds.sock"))],
        &daemon,
        Duration::from_millis(200),
    )
    .await;

    // The workload gets the dataplane's identity, over a key the agent made.
    let mut svids = x509_stream(&agent.socket).await;
    let first = next(&mut svids).await;
    assert_eq!(first.svids.len(), 1);
    assert_eq!(first.svids[0].spiffe_id, "spiffe://default/batch");
    let old_issuer = leaf_issuer(&first);
    let old_cas = ca_subjects(&first.svids[0].bundle);
    assert!(old_cas.contains(&old_issuer), "the bundle holds its issuer");

    // The key is nowhere on the server's side: not in its data directory, not in its admin API.
    let key = WorkloadKey::of(&first.svids[0].x509_svid_key);
    key.assert_not_under(&root.path().join("data"));
    for path in [
        "/api/status",
        "/api/agents",
        "/api/dataplanes",
        "/api/dataplanes/default/batch-1",
        "/api/streams",
    ] {
        let text = admin_text(daemon.admin_addr, path).await;
        key.assert_not_in(path, text.as_bytes());
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
    let mut again = x509_stream(&agent.socket).await;
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
    agent.stop().await;
    daemon.stop().await;
}

/// Dataplane `name` of mesh `default` as `daemon`'s owner reports it.
async fn dataplane(daemon: &Daemon, name: &str) -> DataplaneStatus {
    let status = daemon.status.status().await.expect("the owner answers");
    status
        .dataplanes
        .into_iter()
        .find(|d| d.mesh == "default" && d.name == name)
        .unwrap_or_else(|| panic!("no dataplane default/{name} in the status"))
}

/// The names of the agents `/api/agents` lists.
async fn connected_agents(daemon: &Daemon) -> Vec<String> {
    let response = admin_text(daemon.admin_addr, "/api/agents").await;
    let (_, body) = response.split_once("\r\n\r\n").expect("a body");
    let agents: serde_json::Value = serde_json::from_str(body).expect("/api/agents is JSON");
    agents
        .as_array()
        .expect("/api/agents is a list")
        .iter()
        .map(|a| a["name"].as_str().expect("an agent's name").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_agent_token_gets_no_new_certificate_and_its_agent_keeps_serving_what_it_holds() {
    let root = tempfile::tempdir().expect("a temp dir");
    let uid = my_uid();
    let resources = write_resources(
        root.path(),
        &format!(
            "{}---\n{}",
            registration("host-a", "batch-1", "batch", "10.0.0.1", &uid),
            registration("host-b", "reports-1", "reports", "10.0.0.2", &uid)
        ),
    );
    // The revocation list is watched, as `meshca serve` watches it.
    let daemon = start(settings(root.path()), true).await;
    let servers = vec![ServerAddr::Unix(root.path().join("sds.sock"))];
    // The revoked agent keeps asking; the server refuses each time.
    let retry = Duration::from_millis(200);
    let revoked = TestAgent::start(root.path(), "host-a", servers.clone(), &daemon, retry).await;
    let other = TestAgent::start(root.path(), "host-b", servers, &daemon, retry).await;

    let mut held_stream = x509_stream(&revoked.socket).await;
    let held = next(&mut held_stream).await;
    assert_eq!(held.svids[0].spiffe_id, "spiffe://default/batch");
    let held_leaf = leaf_der(&held);
    let old_issuer = leaf_issuer(&held);
    let old_cas = ca_subjects(&held.svids[0].bundle);
    let mut other_stream = x509_stream(&other.socket).await;
    let other_first = next(&mut other_stream).await;
    assert_eq!(other_first.svids[0].spiffe_id, "spiffe://default/reports");
    assert_eq!(leaf_issuer(&other_first), old_issuer);
    let before = dataplane(&daemon, "batch-1").await;
    assert!(before.connected, "{before:?}");
    let held_expiry = revoked.agent.status().get().registrations[0]
        .registration
        .expires
        .clone();
    assert!(held_expiry.is_some(), "the agent reports what it serves");

    // The operator revokes host-a's token as `meshca token --revoke` does: into the list the daemon
    // watches.
    let list = root.path().join("data").join(revocations::FILE_NAME);
    assert_eq!(
        revocations::revoke(&list, &revoked.claims.id, true).expect("revokes"),
        Revoked::Added
    );
    // The server ends the agent's stream and refuses it from then on; the agent says why.
    let mut agent_status = revoked.agent.status().subscribe();
    let refused = tokio::time::timeout(
        TIMEOUT,
        agent_status.wait_for(|s| {
            s.server.connected.is_none()
                && s.server
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("revoked"))
        }),
    )
    .await
    .expect("the agent is refused in time")
    .expect("the agent runs")
    .clone();
    let reason = refused.server.last_error.unwrap_or_default();
    assert!(
        reason.contains(&revoked.claims.id),
        "the reason names the token: {reason}"
    );
    // The stream ends with PERMISSION_DENIED; a new one is refused as unauthenticated.
    assert!(
        reason.contains("PermissionDenied") || reason.contains("Unauthenticated"),
        "{reason}"
    );
    assert!(refused.serving, "the agent still serves what it holds");

    // A CA rotation: the owner issues anew to every connected proxy. Host-b's workload, whose agent's
    // token stands, gets an SVID from the new CA; once it has, the rotation is done.
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-2", &["ca-1"])).expect("mesh.yaml");
    reload(&daemon).await;
    let new_issuer = loop {
        let issuer = leaf_issuer(&next(&mut other_stream).await);
        if issuer != old_issuer {
            break issuer;
        }
    };

    // No certificate was issued over host-a's keys: the server holds batch-1's old one, disconnected.
    let after = dataplane(&daemon, "batch-1").await;
    assert!(!after.connected, "{after:?}");
    assert_eq!(
        (&after.serial, after.regenerations),
        (&before.serial, before.regenerations),
        "no new certificate for batch-1"
    );
    let reports = dataplane(&daemon, "reports-1").await;
    assert!(reports.connected, "{reports:?}");
    assert!(
        reports
            .issuer
            .as_deref()
            .is_some_and(|i| i.contains("ca-2")),
        "{reports:?}"
    );
    assert_eq!(connected_agents(&daemon).await, ["host-b"]);

    // Host-a's workload holds its SVID: whatever reached its stream since is the same certificate
    // and key, and a new stream gets them too, with the bundle it had (nothing of the new CA).
    while let Ok(message) = tokio::time::timeout(Duration::ZERO, held_stream.message()).await {
        let message = message.expect("the stream stays open").expect("a message");
        assert_eq!(leaf_der(&message), held_leaf, "the SVID did not change");
    }
    let mut fresh = x509_stream(&revoked.socket).await;
    let now = next(&mut fresh).await;
    assert_eq!(leaf_der(&now), held_leaf, "the workload keeps the old SVID");
    assert_eq!(now.svids[0].x509_svid_key, held.svids[0].x509_svid_key);
    assert_eq!(leaf_issuer(&now), old_issuer);
    let bundle = ca_subjects(&now.svids[0].bundle);
    assert_eq!(bundle, old_cas);
    assert!(!bundle.contains(&new_issuer));
    let status = revoked.agent.status().get();
    assert!(status.serving && status.server.connected.is_none());
    assert_eq!(status.registrations[0].registration.expires, held_expiry);

    revoked.stop().await;
    other.stop().await;
    daemon.stop().await;
}

/// Writes `bytes` to `path`, readable by its owner only (as the key-encryption key must be).
fn write_private(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).expect("the temp dir is writable");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Replica `name`'s settings in `root`: on `pg`'s database, with the key-encryption key (`kek`) and
/// the database password (`db-password`) every replica shares in `shared`.
fn replica_settings(root: &Path, pg: &TestPostgres, shared: &Path, name: &str) -> Settings {
    let mut settings = settings(root);
    settings.keystore = KeystoreSettings {
        kind: KeystoreType::Postgres,
        postgres: Some(PostgresSettings {
            url: pg.url(),
            password_file: Some(shared.join("db-password")),
            key_encryption_key_file: shared.join("kek"),
            ca_file: None,
            timeout: meshca_config::DEFAULT_POSTGRES_TIMEOUT,
            max_connections: meshca_config::DEFAULT_POSTGRES_MAX_CONNECTIONS,
        }),
    };
    settings.replica = ReplicaSettings {
        name: name.to_owned(),
        lease_timeout: meshca_config::DEFAULT_LEASE_TIMEOUT,
    };
    settings
}

/// How often the database is read while a replica records a certificate.
const RECORD_POLL: Duration = Duration::from_millis(50);

/// The dump of `pg`'s database once it records `leaf` as batch-1's certificate. A replica records
/// what it issued in a task of its own, with nothing a test can await: the row is read until it
/// holds the certificate (or `TIMEOUT` passed).
async fn dump_once_recorded(pg: &TestPostgres, leaf: &Traces) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let chain = tokio::task::block_in_place(|| {
            pg.psql(
                "meshca",
                "SELECT chain FROM meshca_proxies WHERE mesh = 'default' AND name = 'batch-1'",
            )
        });
        if leaf.found_in(chain.as_bytes()).is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the database did not record batch-1's certificate within {TIMEOUT:?}; it holds {chain:?}"
        );
        tokio::time::sleep(RECORD_POLL).await;
    }
    let dump = tokio::task::block_in_place(|| pg.dump("meshca"));
    // What the scans below look for in the dump is what they would find of a key stored beside it.
    assert!(
        leaf.found_in(&dump).is_some(),
        "the dump holds the workload's certificate"
    );
    dump
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_postgres_store_no_workload_key_serve_on_when_one_stops_and_refuse_a_revoked_agent(
) {
    let pg = tokio::task::block_in_place(TestPostgres::start);
    let shared = tempfile::tempdir().expect("a temp dir");
    write_private(&shared.path().join("kek"), &[7u8; 32]);
    write_private(
        &shared.path().join("db-password"),
        format!("{}\n", pg.password()).as_bytes(),
    );
    let uid = my_uid();
    let (root_a, root_b, agent_root) = (
        tempfile::tempdir().expect("a temp dir"),
        tempfile::tempdir().expect("a temp dir"),
        tempfile::tempdir().expect("a temp dir"),
    );
    write_resources(root_a.path(), &workloads(&uid));
    write_resources(root_b.path(), &workloads(&uid));
    let replica_a = start(
        replica_settings(root_a.path(), &pg, shared.path(), "replica-a"),
        false,
    )
    .await;
    let replica_b = start(
        replica_settings(root_b.path(), &pg, shared.path(), "replica-b"),
        false,
    )
    .await;
    // The agent lists both replicas and connects to the first.
    let agent = TestAgent::start(
        agent_root.path(),
        "host-a",
        vec![
            ServerAddr::Unix(root_a.path().join("sds.sock")),
            ServerAddr::Unix(root_b.path().join("sds.sock")),
        ],
        &replica_a,
        Duration::from_millis(200),
    )
    .await;
    let mut svids = x509_stream(&agent.socket).await;
    let first = next(&mut svids).await;
    assert_eq!(first.svids[0].spiffe_id, "spiffe://default/batch");
    let issuer = leaf_issuer(&first);
    assert_eq!(connected_agents(&replica_a).await, ["host-a"]);

    // Replica a recorded the workload's certificate in the database, for the other replicas, and
    // nothing of its key: not in the database, not in either replica's data directory.
    let first_leaf = Traces::of("the certificate replica a issued", &leaf_der(&first));
    let first_key = WorkloadKey::of(&first.svids[0].x509_svid_key);
    let dump = dump_once_recorded(&pg, &first_leaf).await;
    first_key.assert_not_in("the database dump", &dump);
    first_key.assert_not_under(&root_a.path().join("data"));
    first_key.assert_not_under(&root_b.path().join("data"));

    // Replica a stops. The agent moves to replica b, which holds no key for the certificate a
    // issued (it may serve it, adopted from the database, until it issues its own) and issues the
    // workload a certificate of its own over a key of the agent's, from the CA the replicas share.
    replica_a.stop().await;
    let moved = loop {
        let message = next(&mut svids).await;
        assert_eq!(message.svids.len(), 1, "the workload keeps an identity");
        if leaf_der(&message) != first_leaf.raw {
            break message;
        }
    };
    assert_eq!(moved.svids[0].spiffe_id, "spiffe://default/batch");
    assert_eq!(leaf_issuer(&moved), issuer, "the CA the replicas share");
    assert_eq!(connected_agents(&replica_b).await, ["host-a"]);
    let on_b = dataplane(&replica_b, "batch-1").await;
    assert!(
        on_b.connected && on_b.reason.is_none(),
        "replica b serves batch-1: {on_b:?}"
    );

    // What replica b recorded holds no key either: neither the agent's new one nor the old one.
    let second_leaf = Traces::of("the certificate replica b issued", &leaf_der(&moved));
    let second_key = WorkloadKey::of(&moved.svids[0].x509_svid_key);
    let dump = dump_once_recorded(&pg, &second_leaf).await;
    for key in [&first_key, &second_key] {
        key.assert_not_in("the database dump", &dump);
        key.assert_not_under(&root_a.path().join("data"));
        key.assert_not_under(&root_b.path().join("data"));
    }

    // The operator revokes the agent's token with replica a's settings, as `meshca token --revoke`
    // does: into the database, which replica b reads. Replica b ends the agent's stream; the agent
    // keeps serving what it holds.
    let settings_a = replica_settings(root_a.path(), &pg, shared.path(), "replica-a");
    let id = agent.claims.id.clone();
    let added = tokio::task::spawn_blocking(move || {
        let (_, store) = meshca_daemon::open_store(&settings_a).expect("the store opens");
        store
            .revocations()
            .expect("the database keeps the revoked tokens")
            .revoke(&id, "revoked by the test")
            .expect("revokes")
    })
    .await
    .expect("the revocation ran");
    assert!(added, "the token was not revoked before");
    let mut agent_status = agent.agent.status().subscribe();
    let refused = tokio::time::timeout(
        TIMEOUT,
        agent_status.wait_for(|s| {
            s.server.connected.is_none()
                && s.server
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("revoked") && e.contains(&agent.claims.id))
        }),
    )
    .await
    .expect("replica b refuses the agent in time")
    .expect("the agent runs")
    .clone();
    assert!(refused.serving, "the agent still serves what it holds");
    let mut again = x509_stream(&agent.socket).await;
    let held = next(&mut again).await;
    assert_eq!(
        leaf_der(&held),
        second_leaf.raw,
        "the workload keeps its SVID"
    );

    agent.stop().await;
    replica_b.stop().await;
    tokio::task::block_in_place(move || drop(pg));
}

#[test]
fn the_key_scan_finds_a_key_stored_as_bytes_hex_or_pem_in_a_dump() {
    use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("a key");
    let pkcs8 = pkcs8.as_ref();
    let key = WorkloadKey::of(pkcs8);
    let found = |content: &[u8]| {
        std::panic::catch_unwind(|| key.assert_not_in("content", content))
            .expect_err("the key is found")
    };
    // The bytes themselves, anywhere in a file.
    found(&[b"prefix".as_slice(), pkcs8, b"suffix"].concat());
    // A bytea, as pg_dump writes it.
    let hex: String = pkcs8.iter().map(|b| format!("{b:02x}")).collect();
    found(format!("COPY t (key) FROM stdin;\n\\\\x{hex}\n\\.\n").as_bytes());
    // PEM in a text column, its line breaks escaped, after text of every length modulo 3.
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", pkcs8.to_vec())).replace('\n', "\\n");
    for prefix in ["", "a", "ab"] {
        found(format!("{prefix}{pem}").as_bytes());
    }
    // The private scalar alone, inside a longer base64 text at each alignment.
    let scalar = &pkcs8[36..68];
    for before in 0..3 {
        let blob = [vec![0u8; before], scalar.to_vec(), vec![1u8; 5]].concat();
        found(
            base64::engine::general_purpose::STANDARD
                .encode(blob)
                .as_bytes(),
        );
    }
    // And nothing in what does not hold it.
    key.assert_not_in("another key", &[0u8; 200]);
}
