//! The Workload API of a daemon started in process, driven by raw gRPC calls over its unix socket:
//! the security header, the methods it does not serve, who gets what, and streams that follow changes.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use meshca_config::{ListenAddr, Settings};
use meshca_daemon::{Daemon, DaemonOptions};
use meshca_workload::proto::{
    paths, JwtBundlesRequest, JwtSvidRequest, ValidateJwtSvidRequest, X509BundlesRequest,
    X509BundlesResponse, X509SvidRequest, X509SvidResponse,
};
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};
use tonic_prost::ProstCodec;

/// How long any one step may take.
const TIMEOUT: Duration = Duration::from_secs(30);

const MESH: &str = r#"
type: Mesh
name: default
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
"#;

fn registration(name: &str, selectors: &str, hint: &str) -> String {
    format!(
        "type: WorkloadRegistration\nmesh: default\nname: {name}\nspec:\n  dataplane: batch-1\n  \
         selectors: {selectors}\n  hint: {hint}\n"
    )
}

/// This test process's effective uid or gid (`Uid` or `Gid`), as a registration selects it.
fn my_selector(id: &str) -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{id}:")))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("an effective id");
    format!("unix:{}:{value}", id.to_lowercase())
}

fn my_uid_selector() -> String {
    my_selector("Uid")
}

struct Fixture {
    _root: tempfile::TempDir,
    resources: PathBuf,
    socket: PathBuf,
    daemon: Daemon,
}

impl Fixture {
    async fn start(registrations: &str) -> Fixture {
        let root = tempfile::tempdir().expect("a temp dir");
        let resources = root.path().join("resources");
        std::fs::create_dir(&resources).expect("resources dir");
        std::fs::write(resources.join("mesh.yaml"), MESH).expect("mesh.yaml");
        std::fs::write(resources.join("workloads.yaml"), registrations).expect("workloads.yaml");
        let socket = root.path().join("workload.sock");
        let mut settings = Settings {
            data_dir: root.path().join("data"),
            resources: resources.clone(),
            ..Settings::default()
        };
        settings.sds.listen = vec![ListenAddr::Unix(root.path().join("sds.sock"))];
        settings.sds.tls = None;
        settings.admin.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        settings.workload_api.listen = vec![socket.clone()];
        let options = DaemonOptions {
            gate: true,
            watch_files: false,
        };
        let daemon = tokio::time::timeout(TIMEOUT, Daemon::start(settings, options))
            .await
            .expect("starts in time")
            .expect("the daemon starts");
        Fixture {
            _root: root,
            resources,
            socket,
            daemon,
        }
    }

    /// Replaces the registrations and waits until the daemon applied them.
    async fn set_registrations(&self, registrations: &str) {
        std::fs::write(self.resources.join("workloads.yaml"), registrations).expect("written");
        let outcome = self
            .daemon
            .reload_resources()
            .await
            .expect("the daemon runs");
        if let Err(errors) = outcome {
            panic!("the update was rejected: {errors:?}");
        }
    }

    async fn client(&self) -> tonic::client::Grpc<Channel> {
        client(&self.socket).await
    }
}

async fn client(socket: &Path) -> tonic::client::Grpc<Channel> {
    let channel = meshca_sds::connect_channel(&format!("unix://{}", socket.display()), None)
        .await
        .expect("connects");
    tonic::client::Grpc::new(channel)
}

fn with_header<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().expect("ascii"));
    request
}

async fn stream<Q, R>(
    grpc: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    request: Request<Q>,
) -> Result<Streaming<R>, Status>
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready().await.expect("ready");
    let response = grpc
        .server_streaming(
            request,
            path.parse().expect("a path"),
            ProstCodec::default(),
        )
        .await?;
    Ok(response.into_inner())
}

async fn unary<Q, R>(
    grpc: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    request: Request<Q>,
) -> Result<R, Status>
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready().await.expect("ready");
    let response = grpc
        .unary(
            request,
            path.parse().expect("a path"),
            ProstCodec::default(),
        )
        .await?;
    Ok(response.into_inner())
}

/// One HTTP/1.1 GET of the admin API, its body as JSON.
async fn admin_json(admin: SocketAddr, path: &str) -> serde_json::Value {
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
    let (head, body) = response.split_once("\r\n\r\n").expect("a body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// The next message of a stream, or the status that ended it.
async fn next<R>(stream: &mut Streaming<R>) -> Result<R, Status> {
    match tokio::time::timeout(TIMEOUT, stream.message()).await {
        Ok(Ok(Some(message))) => Ok(message),
        Ok(Ok(None)) => panic!("the stream ended without a status"),
        Ok(Err(status)) => Err(status),
        Err(_) => panic!("no message in time"),
    }
}

fn code_of<T: std::fmt::Debug>(result: Result<T, Status>) -> Code {
    result.expect_err("an error status").code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_refuses_a_request_without_the_security_header() {
    let fixture = Fixture::start(&registration(
        "batch",
        &format!("[{}]", my_uid_selector()),
        "main",
    ))
    .await;
    let mut grpc = fixture.client().await;
    let svid = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        Request::new(X509SvidRequest {}),
    );
    assert_eq!(code_of(svid.await), Code::InvalidArgument);
    let bundles = stream::<_, X509BundlesResponse>(
        &mut grpc,
        paths::FETCH_X509_BUNDLES,
        Request::new(X509BundlesRequest {}),
    );
    assert_eq!(code_of(bundles.await), Code::InvalidArgument);
    let jwt = unary::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_JWT_SVID,
        Request::new(JwtSvidRequest::default()),
    );
    assert_eq!(code_of(jwt.await), Code::InvalidArgument);
    let jwt_bundles = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_JWT_BUNDLES,
        Request::new(JwtBundlesRequest {}),
    );
    assert_eq!(code_of(jwt_bundles.await), Code::InvalidArgument);
    let validate = unary::<_, X509SvidResponse>(
        &mut grpc,
        paths::VALIDATE_JWT_SVID,
        Request::new(ValidateJwtSvidRequest::default()),
    );
    assert_eq!(code_of(validate.await), Code::InvalidArgument);
    for path in [paths::FETCH_WIT_SVID, paths::FETCH_WIT_BUNDLES] {
        let wit = stream::<_, X509SvidResponse>(&mut grpc, path, Request::new(X509SvidRequest {}));
        assert_eq!(code_of(wit.await), Code::InvalidArgument, "{path}");
        let wit = stream::<_, X509SvidResponse>(&mut grpc, path, with_header(X509SvidRequest {}));
        assert_eq!(code_of(wit.await), Code::Unimplemented, "{path}");
    }
    // A wrong value, or the header twice, is no better than none.
    let mut twice = with_header(X509SvidRequest {});
    twice
        .metadata_mut()
        .append("workload.spiffe.io", "true".parse().expect("ascii"));
    assert_eq!(
        code_of(stream::<_, X509SvidResponse>(&mut grpc, paths::FETCH_X509_SVID, twice).await),
        Code::InvalidArgument
    );
    let mut wrong = Request::new(X509SvidRequest {});
    wrong
        .metadata_mut()
        .insert("workload.spiffe.io", "yes".parse().expect("ascii"));
    assert_eq!(
        code_of(stream::<_, X509SvidResponse>(&mut grpc, paths::FETCH_X509_SVID, wrong).await),
        Code::InvalidArgument
    );
    fixture.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_caller_gets_its_svid_and_follows_changes_until_its_registration_goes() {
    let mine = my_uid_selector();
    // Another uid's registration: never this caller's.
    let other = registration("aaa-other", "[unix:uid:4000000]", "other");
    let fixture = Fixture::start(&format!(
        "{other}---\n{}",
        registration("batch", &format!("[{mine}]"), "main")
    ))
    .await;
    let mut grpc = fixture.client().await;
    let mut svids = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        with_header(X509SvidRequest {}),
    )
    .await
    .expect("the stream opens");
    let first = next(&mut svids).await.expect("the first message");
    assert_eq!(first.svids.len(), 1, "only the caller's own registration");
    let svid = &first.svids[0];
    assert_eq!(
        svid.spiffe_id,
        "spiffe://default.default.mesh.local/workload/batch"
    );
    assert_eq!(svid.hint, "main");
    assert!(!svid.bundle.is_empty() && !svid.x509_svid_key.is_empty());
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

    // The admin API lists the registration with this process's stream, and the other with none.
    let listed = admin_json(fixture.daemon.admin_addr, "/api/workloads").await;
    let batch = listed
        .as_array()
        .and_then(|all| all.iter().find(|r| r["name"] == "batch"))
        .unwrap_or_else(|| panic!("batch is listed: {listed}"));
    assert_eq!(
        batch["spiffe_id"],
        "spiffe://default.default.mesh.local/workload/batch"
    );
    assert_eq!(batch["selectors"][0], mine.as_str());
    assert_eq!(batch["streams"][0]["pid"], std::process::id());
    assert_eq!(batch["streams"][0]["method"], "FetchX509SVID");
    let other_listed = listed
        .as_array()
        .and_then(|all| all.iter().find(|r| r["name"] == "aaa-other"))
        .unwrap_or_else(|| panic!("aaa-other is listed: {listed}"));
    assert_eq!(other_listed["streams"], serde_json::json!([]));
    let status = admin_json(fixture.daemon.admin_addr, "/api/status").await;
    assert_eq!(
        status["workload_registrations"][1]["name"], "batch",
        "{status}"
    );

    // A second registration for the same caller (other selectors, so the same hint is allowed): the
    // stream sends both, in name order, the first keeping the hint.
    let two = format!(
        "{other}---\n{}---\n{}",
        registration("batch", &format!("[{mine}]"), "main"),
        registration(
            "batch-b",
            &format!("[{mine}, {}]", my_selector("Gid")),
            "main"
        ),
    );
    fixture.set_registrations(&two).await;
    let second = next(&mut svids).await.expect("a message for the new set");
    assert_eq!(second.svids.len(), 2);
    assert_eq!(second.svids[0].hint, "main");
    assert_eq!(
        second.svids[1].hint, "",
        "a hint already used in the response is dropped"
    );

    // Its registrations removed, the caller's stream ends with PERMISSION_DENIED.
    fixture.set_registrations(&other).await;
    assert_eq!(
        next(&mut svids).await.expect_err("ended").code(),
        Code::PermissionDenied
    );
    let again = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        with_header(X509SvidRequest {}),
    );
    assert_eq!(code_of(again.await), Code::PermissionDenied);
    fixture.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_caller_is_denied_until_a_registration_names_it() {
    let fixture = Fixture::start(&registration("other", "[unix:uid:4000000]", "x")).await;
    let mut grpc = fixture.client().await;
    let denied = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        with_header(X509SvidRequest {}),
    );
    assert_eq!(code_of(denied.await), Code::PermissionDenied);
    let denied = stream::<_, X509BundlesResponse>(
        &mut grpc,
        paths::FETCH_X509_BUNDLES,
        with_header(X509BundlesRequest {}),
    );
    assert_eq!(code_of(denied.await), Code::PermissionDenied);
    fixture
        .set_registrations(&registration(
            "batch",
            &format!("[{}]", my_uid_selector()),
            "main",
        ))
        .await;
    let mut bundles = stream::<_, X509BundlesResponse>(
        &mut grpc,
        paths::FETCH_X509_BUNDLES,
        with_header(X509BundlesRequest {}),
    )
    .await
    .expect("registered now");
    let message = next(&mut bundles).await.expect("bundles");
    assert!(
        message
            .bundles
            .contains_key("spiffe://default.default.mesh.local"),
        "{:?}",
        message.bundles.keys()
    );
    fixture.daemon.stop().await;
}
