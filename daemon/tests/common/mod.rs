//! Helpers for the tests that run a daemon and `meshca agent`s in this process: resources, settings,
//! agents with tokens the daemon minted, Workload API streams on an agent's socket, and a scan for a
//! workload's private key wherever the server side keeps or shows something.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use meshca_agent::{Agent, AgentConfig, ServerAddr};
use meshca_auth::Claims;
use meshca_config::{ListenAddr, Settings};
use meshca_control::DataplaneStatus;
use meshca_daemon::{Daemon, DaemonOptions};
use meshca_workload::proto::{paths, X509SvidRequest, X509SvidResponse};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Streaming};
use tonic_prost::ProstCodec;

/// How long any one step may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// How long the agent gives a workload to apply a message before it counts as applied.
pub const ACK_AFTER: Duration = Duration::from_secs(1);

/// A legacy mesh whose builtin backend `enabled` issues, trusting `also` too.
pub fn mesh(enabled: &str, also: &[&str]) -> String {
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
    format!("type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

/// Dataplane `dataplane` of service `service`, and the WorkloadRegistration (named after the service)
/// that agent `agent` serves it through to processes of `uid`.
pub fn registration(
    agent: &str,
    dataplane: &str,
    service: &str,
    address: &str,
    uid: &str,
) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: {dataplane}\nnetworking:\n  address: {address}\n  inbound: \
         [{{port: 8080, tags: {{kuma.io/service: {service}}}}}]\n---\ntype: WorkloadRegistration\nmesh: \
         default\nname: {service}\nspec:\n  dataplane: {dataplane}\n  selectors: [unix:uid:{uid}]\n  agent: \
         {agent}\n"
    )
}

/// Host `host-a`'s workload: dataplane `batch-1`, `spiffe://default/batch`.
pub fn workloads(uid: &str) -> String {
    registration("host-a", "batch-1", "batch", "10.0.0.1", uid)
}

/// This process's effective uid, which the registrations select.
pub fn my_uid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("an effective uid")
        .to_owned()
}

/// A daemon's settings in `root`: SDS on `root/sds.sock`, the admin API on a free loopback port.
pub fn settings(root: &Path) -> Settings {
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
pub async fn start(settings: Settings, watch_files: bool) -> Daemon {
    let options = DaemonOptions {
        gate: true,
        watch_files,
    };
    tokio::time::timeout(TIMEOUT, Daemon::start(settings, options))
        .await
        .expect("starts in time")
        .expect("the daemon starts")
}

/// Starts a daemon in `root` with the [`settings`] there, watching no file.
pub async fn start_daemon(root: &Path) -> Daemon {
    start(settings(root), false).await
}

/// The resources directory of a daemon in `root`, with mesh `default` on `ca-1` and `workloads`.
pub fn write_resources(root: &Path, workloads: &str) -> PathBuf {
    let resources = root.join("resources");
    std::fs::create_dir_all(&resources).expect("resources dir");
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-1", &[])).expect("mesh.yaml");
    std::fs::write(resources.join("workloads.yaml"), workloads).expect("workloads");
    resources
}

/// An agent started in this process, and what a test needs of it.
pub struct TestAgent {
    /// The agent.
    pub agent: Agent,
    /// Its Workload API socket.
    pub socket: PathBuf,
    /// Its token's claims (the id is what `meshca token --revoke` takes).
    pub claims: Claims,
    /// Stops it.
    pub shutdown: CancellationToken,
}

impl TestAgent {
    /// Starts agent `name` with a token `minter` signs, serving on `root/<name>.sock` what `servers`
    /// send, trying the next server at most `retry` after one refused or failed it.
    pub async fn start(
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
        let agent = Agent::start(
            config,
            meshca_sds::SdsServer::attested_routes_on,
            shutdown.clone(),
        )
        .await
        .expect("the agent starts");
        TestAgent {
            agent,
            socket,
            claims,
            shutdown,
        }
    }

    /// Stops the agent and waits until it stopped.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.agent.wait().await;
    }
}

/// Reloads the daemon's resources now; a rejected update fails the test.
pub async fn reload(daemon: &Daemon) {
    let outcome = daemon.reload_resources().await.expect("the daemon runs");
    if let Err(errors) = outcome {
        panic!("the update was rejected: {errors:?}");
    }
}

/// A `FetchX509SVID` stream on the Workload API socket `socket`.
pub async fn x509_stream(socket: &Path) -> Streaming<X509SvidResponse> {
    let channel: Channel =
        meshca_serve::connect_channel(&format!("unix://{}", socket.display()), None)
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

/// The stream's next message, within [`TIMEOUT`].
pub async fn next(stream: &mut Streaming<X509SvidResponse>) -> X509SvidResponse {
    tokio::time::timeout(TIMEOUT, stream.message())
        .await
        .expect("a message in time")
        .expect("the stream stays open")
        .expect("a message")
}

/// The subjects of the CAs in a concatenated DER bundle.
pub fn ca_subjects(bundle: &[u8]) -> BTreeSet<String> {
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
pub fn leaf_issuer(response: &X509SvidResponse) -> String {
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
pub fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
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
pub fn leaf_der(response: &X509SvidResponse) -> Vec<u8> {
    let chain = &response.svids[0].x509_svid;
    let (rest, _) = x509_parser::parse_x509_certificate(chain).expect("the leaf parses");
    chain[..chain.len() - rest.len()].to_vec()
}

/// The forms stored bytes can hold a value in: the bytes themselves, lowercase hex (how pg_dump writes
/// a `bytea`), and base64 (PEM, or a value inside a longer PEM) at each of the three alignments the
/// value can have in it.
pub struct Traces {
    what: &'static str,
    /// The value itself.
    pub raw: Vec<u8>,
    hex: String,
    base64: Vec<String>,
}

impl Traces {
    /// The traces of `value`, which reports call `what`.
    pub fn of(what: &'static str, value: &[u8]) -> Traces {
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
    pub fn found_in(&self, content: &[u8]) -> Option<&'static str> {
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
pub struct WorkloadKey([Traces; 2]);

impl WorkloadKey {
    /// The traces of `pkcs8`, a P-256 key as ring writes it: 36 bytes every such key shares (the last
    /// two open the 32-byte OCTET STRING), then the private scalar.
    pub fn of(pkcs8: &[u8]) -> WorkloadKey {
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

    /// Fails the test, naming `place` and the form found, when `content` holds the key.
    pub fn assert_not_in(&self, place: &str, content: &[u8]) {
        for traces in &self.0 {
            if let Some(how) = traces.found_in(content) {
                panic!("{place} holds the workload's key: {} {how}", traces.what);
            }
        }
    }

    /// Every file under `dir` is scanned.
    pub fn assert_not_under(&self, dir: &Path) {
        for (path, content) in files_under(dir) {
            self.assert_not_in(&path.display().to_string(), &content);
        }
    }
}

/// The whole HTTP response (status line, headers, body) to `GET path` on the admin API, which must
/// be 200.
pub async fn admin_text(admin: SocketAddr, path: &str) -> String {
    let response = admin_response(admin, path).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response}");
    response
}

/// The whole HTTP response (status line, headers, body) to `GET path` on the admin API.
pub async fn admin_response(admin: SocketAddr, path: &str) -> String {
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
    response
}

/// Dataplane `name` of mesh `default` as `daemon`'s owner reports it.
pub async fn dataplane(daemon: &Daemon, name: &str) -> DataplaneStatus {
    let status = daemon.status.status().await.expect("the owner answers");
    status
        .dataplanes
        .into_iter()
        .find(|d| d.mesh == "default" && d.name == name)
        .unwrap_or_else(|| panic!("no dataplane default/{name} in the status"))
}

/// The names of the agents `/api/agents` lists.
pub async fn connected_agents(daemon: &Daemon) -> Vec<String> {
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

/// Writes `bytes` to `path`, readable by its owner only (as the key-encryption key must be).
pub fn write_private(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).expect("the temp dir is writable");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// `settings` as replica `name` on `pg`'s database, with the key-encryption key (`kek`) and the
/// database password (`db-password`) every replica shares in `shared`.
pub fn on_postgres(
    mut settings: Settings,
    pg: &meshca_testpg::TestPostgres,
    shared: &Path,
    name: &str,
) -> Settings {
    settings.keystore = meshca_config::KeystoreSettings {
        kind: meshca_config::KeystoreType::Postgres,
        postgres: Some(meshca_config::PostgresSettings {
            url: pg.url(),
            password_file: Some(shared.join("db-password")),
            key_encryption_key_file: Some(shared.join("kek")),
            ca_file: None,
            timeout: meshca_config::DEFAULT_POSTGRES_TIMEOUT,
            max_connections: meshca_config::DEFAULT_POSTGRES_MAX_CONNECTIONS,
        }),
        pkcs11: None,
    };
    settings.replica = meshca_config::ReplicaSettings {
        name: name.to_owned(),
        lease_timeout: meshca_config::DEFAULT_LEASE_TIMEOUT,
    };
    settings
}

/// `daemon`'s status of federated trust domain `td` once `done` holds of it.
pub async fn peer_status(
    daemon: &Daemon,
    td: &meshca_identity::TrustDomain,
    done: impl Fn(&meshca_federation::PeerStatus) -> bool,
) -> meshca_federation::PeerStatus {
    let mut status = daemon.federation.status();
    let awaited = tokio::time::timeout(
        TIMEOUT,
        status.wait_for(|all| all.get(td).is_some_and(&done)),
    )
    .await
    .map(|r| r.expect("the importer runs").clone());
    let Ok(all) = awaited else {
        panic!(
            "{td}: not as awaited in time: {:?}",
            daemon.federation.status().borrow().get(td)
        );
    };
    all[td].clone()
}
