//! The agent protocol of a daemon started in process: an agent token reaches `Sync` over the SDS
//! listener, is sent the registrations that name its agent, and is listed by `/api/agents`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_agent_server::proto::{agent_message, paths, AgentMessage, AgentState, Hello};
use meshca_config::{ListenAddr, Settings};
use meshca_daemon::{Daemon, DaemonOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

/// How long any one step may take.
const TIMEOUT: Duration = Duration::from_secs(30);

const RESOURCES: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
---
type: MeshIdentity
name: identity
mesh: default
spec:
  selector:
    dataplane:
      matchLabels: {}
  spiffeID:
    trustDomain: "{{ .Mesh }}.{{ .Zone }}.mesh.local"
    path: "/workload/{{ .Workload }}"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Enabled
      autogenerate:
        enabled: true
---
type: Dataplane
mesh: default
name: batch-1
labels:
  kuma.io/workload: batch
---
type: Dataplane
mesh: default
name: api-1
labels:
  kuma.io/workload: api
---
type: WorkloadRegistration
mesh: default
name: batch
spec:
  dataplane: batch-1
  selectors: ["unix:uid:1001"]
  agent: host-a
---
type: WorkloadRegistration
mesh: default
name: api
spec:
  dataplane: api-1
  selectors: ["unix:uid:1002"]
  agent: host-b
---
type: Dataplane
mesh: default
name: local-1
labels:
  kuma.io/workload: local
---
type: WorkloadRegistration
mesh: default
name: local
spec:
  dataplane: local-1
  selectors: ["unix:uid:1003"]
"#;

/// One HTTP/1.1 GET; the whole response, status line first.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_token_reaches_sync_on_the_sds_listener_and_receives_its_state() {
    let root = tempfile::tempdir().expect("a temp dir");
    let resources = root.path().join("resources");
    std::fs::create_dir(&resources).expect("resources dir");
    std::fs::write(resources.join("mesh.yaml"), RESOURCES).expect("mesh.yaml");
    let mut settings = Settings {
        data_dir: root.path().join("data"),
        resources,
        ..Settings::default()
    };
    settings.sds.listen = vec![ListenAddr::Unix(root.path().join("sds.sock"))];
    settings.sds.tls = None;
    settings.admin.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    // This host's own Workload API socket is off: agents are served all the same.
    settings.workload_api.listen = Vec::new();
    let options = DaemonOptions {
        gate: true,
        watch_files: false,
    };
    let daemon = tokio::time::timeout(TIMEOUT, Daemon::start(settings, options))
        .await
        .expect("starts in time")
        .expect("the daemon starts");

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let claims =
        meshca_auth::Claims::new_agent("host-a", Duration::from_secs(3600), now).expect("claims");
    let token = daemon.mint_token(&claims).expect("a token");
    let target = daemon.unix_target().expect("a unix SDS listener");
    let channel = meshca_serve::connect_channel(&target, None)
        .await
        .expect("connected");

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(AgentMessage {
        message: Some(agent_message::Message::Hello(Hello {
            protocol: 1,
            agent_version: "test".into(),
        })),
    })
    .await
    .expect("queued");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII"),
    );
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let mut states = grpc
        .streaming(
            request,
            PathAndQuery::from_static(paths::SYNC),
            ProstCodec::<AgentMessage, AgentState>::default(),
        )
        .await
        .expect("Sync accepts the agent token")
        .into_inner();
    let state = tokio::time::timeout(TIMEOUT, states.message())
        .await
        .expect("a state in time")
        .expect("the stream is open")
        .expect("a state");
    assert!(state.version > 0, "a published generation");
    let names: Vec<&str> = state
        .registrations
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["batch"], "host-b's registration is not sent");
    assert_eq!(state.registrations[0].dataplane, "batch-1");
    assert_eq!(state.registrations[0].key_algorithm, "ecdsa-p256");
    assert!(!state.all.is_empty(), "the trust of every mesh is sent");
    assert!(
        state.meshes.contains_key("default"),
        "the registration's mesh's trust is sent"
    );

    let listed = get(daemon.admin_addr, "/api/agents")
        .await
        .expect("the admin API answers");
    assert!(listed.starts_with("HTTP/1.1 200"), "{listed}");
    assert!(listed.contains("\"name\":\"host-a\""), "{listed}");
    assert!(listed.contains(&claims.id), "{listed}");

    // `/api/workloads` lists every registration though this server's own socket is off; the one
    // this server would serve itself says why no caller reaches it.
    let workloads = get(daemon.admin_addr, "/api/workloads")
        .await
        .expect("the admin API answers");
    assert!(workloads.starts_with("HTTP/1.1 200"), "{workloads}");
    let body = workloads
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .expect("a body");
    let listed: serde_json::Value = serde_json::from_str(body).expect("JSON");
    let by_name = |name: &str| {
        listed
            .as_array()
            .and_then(|all| all.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name} is listed: {listed}"))
    };
    let local = by_name("local");
    assert_eq!(local["streams"], serde_json::json!([]));
    assert!(
        local["not_served"]
            .as_str()
            .is_some_and(|reason| reason.contains("workloadApi.listen is empty")),
        "{local}"
    );
    assert_eq!(by_name("batch")["not_served"], serde_json::Value::Null);
    assert_eq!(by_name("batch")["agent"], "host-a");

    drop(tx);
    drop(states);
    daemon.stop().await;
}
