//! The Workload API of a daemon started in process, driven by raw gRPC calls over its unix socket:
//! the security header, the methods it does not serve, who gets what, and streams that follow changes.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use meshca_config::{ListenAddr, Settings};
use meshca_daemon::{Daemon, DaemonOptions};
use meshca_workload::jwt::{self, JwksDocument};
use meshca_workload::proto::value::Kind;
use meshca_workload::proto::{
    paths, JwtBundlesRequest, JwtBundlesResponse, JwtSvidRequest, JwtSvidResponse,
    ValidateJwtSvidRequest, ValidateJwtSvidResponse, X509BundlesRequest, X509BundlesResponse,
    X509SvidRequest, X509SvidResponse,
};
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};
use tonic_prost::ProstCodec;

/// How long any one step may take.
const TIMEOUT: Duration = Duration::from_secs(30);

const MESH: &str = r#"
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
        Fixture::start_tuned(registrations, |_| {}).await
    }

    /// Starts a daemon whose settings `tune` changes.
    async fn start_tuned(registrations: &str, tune: impl FnOnce(&mut Settings)) -> Fixture {
        let root = tempfile::tempdir().expect("a temp dir");
        let resources = root.path().join("resources");
        std::fs::create_dir(&resources).expect("resources dir");
        std::fs::write(resources.join("mesh.yaml"), MESH).expect("mesh.yaml");
        std::fs::write(resources.join("workloads.yaml"), registrations).expect("workloads.yaml");
        Fixture::start_in(root, tune).await
    }

    /// Starts a daemon on the data directory and resources under `root`.
    async fn start_in(root: tempfile::TempDir, tune: impl FnOnce(&mut Settings)) -> Fixture {
        let resources = root.path().join("resources");
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
        tune(&mut settings);
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

    /// Stops the daemon and starts another on the same data directory.
    async fn restart(self) -> Fixture {
        self.daemon.stop().await;
        Fixture::start_in(self._root, |_| {}).await
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
    let channel = meshca_serve::connect_channel(&format!("unix://{}", socket.display()), None)
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

/// One GET of the admin API, which must answer 200, its body as JSON.
async fn admin_json(admin: SocketAddr, path: &str) -> serde_json::Value {
    let response = common::admin_text(admin, path).await;
    let (_, body) = response.split_once("\r\n\r\n").expect("a body");
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

/// A registration of this test's uid whose JWT-SVIDs live ten minutes.
fn jwt_registration() -> String {
    format!(
        "{}  jwtSvid:\n    expiry: 10m\n",
        registration("batch", &format!("[{}]", my_uid_selector()), "main")
    )
}

fn audiences(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

async fn fetch_jwt(
    grpc: &mut tonic::client::Grpc<Channel>,
    audience: Vec<String>,
) -> Result<JwtSvidResponse, Status> {
    unary(
        grpc,
        paths::FETCH_JWT_SVID,
        with_header(JwtSvidRequest {
            audience,
            spiffe_id: String::new(),
        }),
    )
    .await
}

async fn validate_jwt(
    grpc: &mut tonic::client::Grpc<Channel>,
    audience: &str,
    svid: &str,
) -> Result<ValidateJwtSvidResponse, Status> {
    unary(
        grpc,
        paths::VALIDATE_JWT_SVID,
        with_header(ValidateJwtSvidRequest {
            audience: audience.to_owned(),
            svid: svid.to_owned(),
        }),
    )
    .await
}

/// The first `FetchJWTBundles` message's JWK Set of the mesh's trust domain.
async fn jwks(grpc: &mut tonic::client::Grpc<Channel>) -> JwksDocument {
    let mut bundles = stream::<_, JwtBundlesResponse>(
        grpc,
        paths::FETCH_JWT_BUNDLES,
        with_header(JwtBundlesRequest {}),
    )
    .await
    .expect("the stream opens");
    let message = next(&mut bundles).await.expect("the first message");
    let bytes = message
        .bundles
        .get(&format!("spiffe://{TRUST_DOMAIN}"))
        .unwrap_or_else(|| panic!("no bundle of {TRUST_DOMAIN}: {:?}", message.bundles.keys()));
    JwksDocument::parse(bytes).expect("a JWK Set")
}

const TRUST_DOMAIN: &str = "default.default.mesh.local";

/// A part of a compact JWS (0 header, 1 claims), as JSON.
fn jws_part(token: &str, index: usize) -> serde_json::Value {
    use base64::Engine as _;
    let part = token.split('.').nth(index).expect("a compact JWS");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_caller_gets_jwt_svids_its_bundles_verify_and_the_key_is_kept() {
    let fixture = Fixture::start(&jwt_registration()).await;
    let mut grpc = fixture.client().await;
    let jwks_doc = jwks(&mut grpc).await;
    assert_eq!(jwks_doc.keys().len(), 1, "one key per trust domain");
    let kid = jwks_doc.keys()[0].kid().to_owned();

    let response = fetch_jwt(&mut grpc, audiences(&["first", "second"]))
        .await
        .expect("a JWT-SVID");
    assert_eq!(response.svids.len(), 1);
    let svid = &response.svids[0];
    let spiffe_id = format!("spiffe://{TRUST_DOMAIN}/workload/batch");
    assert_eq!(svid.spiffe_id, spiffe_id);
    assert_eq!(svid.hint, "main");
    let keys = |td: &str, k: &str| {
        (td == TRUST_DOMAIN)
            .then(|| jwks_doc.get(k).cloned())
            .flatten()
    };
    for audience in ["first", "second"] {
        let validated =
            jwt::validate(&svid.svid, audience, &keys, unix_now()).expect("the bundle verifies it");
        assert_eq!(validated.spiffe_id.as_str(), spiffe_id);
    }
    assert_eq!(jws_part(&svid.svid, 0)["kid"], kid.as_str());
    let claims = jws_part(&svid.svid, 1);
    let (iat, exp) = (
        claims["iat"].as_u64().expect("iat"),
        claims["exp"].as_u64().expect("exp"),
    );
    assert_eq!(exp - iat, 600, "the registration's jwtSvid.expiry");
    assert_eq!(claims["sub"], spiffe_id.as_str());
    assert_eq!(claims["aud"], serde_json::json!(["first", "second"]));

    let again = fetch_jwt(&mut grpc, audiences(&["first", "second"]))
        .await
        .expect("a JWT-SVID");
    assert_eq!(again.svids[0].svid, svid.svid, "the cached token");

    // Validation by the daemon.
    let validated = validate_jwt(&mut grpc, "second", &svid.svid)
        .await
        .expect("valid");
    assert_eq!(validated.spiffe_id, spiffe_id);
    let claims = validated.claims.expect("claims");
    match claims.fields.get("aud").and_then(|v| v.kind.as_ref()) {
        Some(Kind::ListValue(list)) => {
            let auds: Vec<_> = list
                .values
                .iter()
                .map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => s.clone(),
                    other => panic!("an audience that is not a string: {other:?}"),
                })
                .collect();
            assert_eq!(auds, ["first", "second"]);
        }
        other => panic!("aud is not a list: {other:?}"),
    }
    match claims.fields.get("sub").and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(sub)) => assert_eq!(*sub, spiffe_id),
        other => panic!("sub is not a string: {other:?}"),
    }
    let wrong = validate_jwt(&mut grpc, "third", &svid.svid).await;
    assert_eq!(code_of(wrong), Code::InvalidArgument);
    let mut tampered = svid.svid.clone();
    let last = tampered.pop().expect("not empty");
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let refused = validate_jwt(&mut grpc, "first", &tampered).await;
    assert_eq!(code_of(refused), Code::InvalidArgument);
    let status = validate_jwt(&mut grpc, "", &svid.svid)
        .await
        .expect_err("no audience");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("audience"), "{status:?}");
    let status = validate_jwt(&mut grpc, &"a".repeat(1025), &svid.svid)
        .await
        .expect_err("audience too long");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("jwtAudienceBytes"), "{status:?}");
    let status = validate_jwt(&mut grpc, "first", "")
        .await
        .expect_err("no token");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("svid"), "{status:?}");

    // Requests out of bounds.
    let status = fetch_jwt(&mut grpc, vec![]).await.expect_err("no audience");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "audience must be specified");
    let many: Vec<String> = (0..33).map(|i| format!("aud-{i}")).collect();
    let status = fetch_jwt(&mut grpc, many).await.expect_err("too many");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("jwtAudiencesPerRequest"),
        "{status:?}"
    );
    let lots: Vec<String> = (0..5000).map(|i| format!("aud-{i}")).collect();
    let status = fetch_jwt(&mut grpc, lots).await.expect_err("far too many");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // Over limits.workloadRequestBytes (64 KiB): refused before it is decoded, as documented.
    let oversize: Vec<String> = (0..100)
        .map(|i| format!("{i}-{}", "a".repeat(1000)))
        .collect();
    let status = fetch_jwt(&mut grpc, oversize).await.expect_err("too large");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("limits.workloadRequestBytes"),
        "{status:?}"
    );
    // A workload asking for a token for another identity than its own gets none.
    let status = unary::<_, JwtSvidResponse>(
        &mut grpc,
        paths::FETCH_JWT_SVID,
        with_header(JwtSvidRequest {
            audience: audiences(&["first"]),
            spiffe_id: format!("spiffe://{TRUST_DOMAIN}/workload/other"),
        }),
    )
    .await
    .expect_err("not its identity");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("workload/other"), "{status:?}");
    // The daemon keeps serving.
    fetch_jwt(&mut grpc, audiences(&["first"]))
        .await
        .expect("still served");

    // An open FetchJWTBundles stream ends with UNAVAILABLE when the daemon stops.
    let mut open = stream::<_, JwtBundlesResponse>(
        &mut grpc,
        paths::FETCH_JWT_BUNDLES,
        with_header(JwtBundlesRequest {}),
    )
    .await
    .expect("the stream opens");
    next(&mut open).await.expect("the first message");

    // The key was persisted: a restarted daemon signs with the same one.
    drop(grpc);
    let fixture = fixture.restart().await;
    let status = next(&mut open).await.expect_err("ended by the shutdown");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    let mut grpc = fixture.client().await;
    let after = jwks(&mut grpc).await;
    assert_eq!(after.keys().len(), 1);
    assert_eq!(after.keys()[0].kid(), kid, "the same key after a restart");
    let response = fetch_jwt(&mut grpc, audiences(&["first"]))
        .await
        .expect("a JWT-SVID");
    assert_eq!(jws_part(&response.svids[0].svid, 0)["kid"], kid.as_str());
    fixture.daemon.stop().await;
}

/// Two registrations of one Dataplane (so one SPIFFE ID) with different `jwtSvid.expiry`: each gets
/// tokens of its own lifetime, never the other's kept token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_of_one_identity_with_different_expiries_get_their_own_tokens() {
    let uid = format!("[{}]", my_uid_selector());
    let registrations = format!(
        "{}  jwtSvid:\n    expiry: 10m\n---\n{}  jwtSvid:\n    expiry: 2s\n",
        registration("long", &uid, "long"),
        registration("short", &uid, "short"),
    );
    let fixture = Fixture::start(&registrations).await;
    let mut grpc = fixture.client().await;
    for round in 0..2 {
        let response = fetch_jwt(&mut grpc, audiences(&["same"]))
            .await
            .expect("JWT-SVIDs");
        let lifetimes: Vec<(String, u64)> = response
            .svids
            .iter()
            .map(|svid| {
                let claims = jws_part(&svid.svid, 1);
                let lifetime =
                    claims["exp"].as_u64().expect("exp") - claims["iat"].as_u64().expect("iat");
                (svid.hint.clone(), lifetime)
            })
            .collect();
        assert_eq!(
            lifetimes,
            [("long".to_owned(), 600), ("short".to_owned(), 2)],
            "round {round}"
        );
        assert_eq!(response.svids[0].spiffe_id, response.svids[1].spiffe_id);
    }
    fixture.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_caller_gets_no_jwt_method() {
    let fixture = Fixture::start(&registration("other", "[unix:uid:4000000]", "x")).await;
    let mut grpc = fixture.client().await;
    let status = fetch_jwt(&mut grpc, audiences(&["a"]))
        .await
        .expect_err("denied");
    assert_eq!(status.code(), Code::PermissionDenied);
    let bundles = stream::<_, JwtBundlesResponse>(
        &mut grpc,
        paths::FETCH_JWT_BUNDLES,
        with_header(JwtBundlesRequest {}),
    );
    assert_eq!(code_of(bundles.await), Code::PermissionDenied);
    let status = validate_jwt(&mut grpc, "a", "a.b.c")
        .await
        .expect_err("denied");
    assert_eq!(status.code(), Code::PermissionDenied);
    fixture.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_bundles_stream_ends_when_its_callers_registration_goes() {
    let fixture = Fixture::start(&jwt_registration()).await;
    let mut grpc = fixture.client().await;
    let mut bundles = stream::<_, JwtBundlesResponse>(
        &mut grpc,
        paths::FETCH_JWT_BUNDLES,
        with_header(JwtBundlesRequest {}),
    )
    .await
    .expect("the stream opens");
    let first = next(&mut bundles).await.expect("the first message");
    assert!(first
        .bundles
        .contains_key(&format!("spiffe://{TRUST_DOMAIN}")));
    fixture
        .set_registrations(&registration("other", "[unix:uid:4000000]", "x"))
        .await;
    let status = next(&mut bundles).await.expect_err("ended");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    fixture.daemon.stop().await;
}

/// Opens `FetchX509SVID` streams until one opens, for as long as `TIMEOUT`: a stream the client
/// dropped leaves the server's count once the server has read its reset.
async fn open_when_room(grpc: &mut tonic::client::Grpc<Channel>) -> Streaming<X509SvidResponse> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match stream(
            grpc,
            paths::FETCH_X509_SVID,
            with_header(X509SvidRequest {}),
        )
        .await
        {
            Ok(opened) => return opened,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no room came: {status}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("unexpected refusal: {status}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_past_its_stream_limit_is_refused_until_one_of_its_streams_ends() {
    let registrations = registration("batch", &format!("[{}]", my_uid_selector()), "main");
    let fixture = Fixture::start_tuned(&registrations, |settings| {
        settings.limits.workload_streams_per_caller = 2;
    })
    .await;
    let mut grpc = fixture.client().await;
    let mut first = open_when_room(&mut grpc).await;
    next(&mut first).await.expect("the first stream is served");
    let mut second = open_when_room(&mut grpc).await;
    next(&mut second)
        .await
        .expect("the second stream is served");
    let third = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        with_header(X509SvidRequest {}),
    )
    .await
    .expect_err("a third stream of one process is refused");
    assert_eq!(third.code(), Code::ResourceExhausted, "{third}");
    assert!(
        third.message().contains("limits.workloadStreamsPerCaller"),
        "{third}"
    );
    // A stream that ends gives its place back.
    drop(first);
    let mut again = open_when_room(&mut grpc).await;
    next(&mut again)
        .await
        .expect("a stream opens once one ended");
    drop((second, again));
    fixture.daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed_and_the_others_keep_their_streams() {
    let registrations = registration("batch", &format!("[{}]", my_uid_selector()), "main");
    let fixture = Fixture::start_tuned(&registrations, |settings| {
        settings.limits.workload_connections = 1;
    })
    .await;
    let mut held = fixture.client().await;
    let mut svids = open_when_room(&mut held).await;
    next(&mut svids)
        .await
        .expect("the first connection is served");
    // A second connection is closed as soon as it is accepted: its HTTP/2 handshake fails, or, if
    // the client counted it done first, its first call does.
    let target = format!("unix://{}", fixture.socket.display());
    if let Ok(channel) = meshca_serve::connect_channel(&target, None).await {
        let mut refused = tonic::client::Grpc::new(channel);
        let status = stream::<_, X509SvidResponse>(
            &mut refused,
            paths::FETCH_X509_SVID,
            with_header(X509SvidRequest {}),
        )
        .await
        .expect_err("the second connection is closed");
        assert!(
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled
            ),
            "{status}"
        );
    }
    // The first connection still serves: a registration change reaches its stream.
    fixture
        .set_registrations(&format!(
            "{registrations}---\n{}",
            registration(
                "batch-b",
                &format!("[{}, {}]", my_uid_selector(), my_selector("Gid")),
                "b"
            )
        ))
        .await;
    let both = next(&mut svids)
        .await
        .expect("the stream follows the change");
    assert_eq!(both.svids.len(), 2);
    fixture.daemon.stop().await;
}

/// Receives one file descriptor sent over `socket` with SCM_RIGHTS.
fn receive_fd(socket: &std::os::unix::net::UnixStream) -> std::os::fd::OwnedFd {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    rustix::net::recvmsg(
        socket,
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::empty(),
    )
    .expect("a message with a descriptor");
    control
        .drain()
        .find_map(|message| match message {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        })
        .expect("a descriptor")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_handed_on_by_a_process_that_exited_gets_nothing() {
    // The registration selects this uid: the process that connects below has it too, so only the
    // check that the caller is still the process that connected can refuse the call.
    let registrations = registration("batch", &format!("[{}]", my_uid_selector()), "main");
    let fixture = Fixture::start(&registrations).await;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    // A process of this uid connects to the Workload API, hands the connection to this test over
    // its stdin (SCM_RIGHTS) and exits.
    let handed = std::process::Command::new("python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
             socket.send_fds(socket.socket(fileno=0), [b'x'], [s.fileno()])\n",
        ])
        .arg(&fixture.socket)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .status()
        .expect("python3 runs");
    assert!(handed.success(), "the connecting process failed: {handed}");
    let connection = std::os::unix::net::UnixStream::from(receive_fd(&ours));
    connection.set_nonblocking(true).expect("non-blocking");
    let connection = tokio::net::UnixStream::from_std(connection).expect("a tokio stream");
    let mut once = Some(connection);
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let connection = once.take();
        async move {
            connection
                .map(hyper_util::rt::TokioIo::new)
                .ok_or_else(|| std::io::Error::other("the handed-on connection was used already"))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .expect("HTTP/2 over the handed-on connection");
    let mut grpc = tonic::client::Grpc::new(channel);
    let refused = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        with_header(X509SvidRequest {}),
    )
    .await
    .expect_err("the caller that connected is gone");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused}");
    // This test's own connection, same uid, is served: the refusal was about the caller, not the uid.
    let mut own = fixture.client().await;
    let mut svids = open_when_room(&mut own).await;
    next(&mut svids)
        .await
        .expect("served to the process that connected");
    fixture.daemon.stop().await;
}

mod sds {
    //! SDS on the Workload API socket, as an Envoy set up for a SPIRE agent asks for it: no token, a
    //! node id that names nothing, SPIRE's resource names.

    use super::*;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
    use meshca_sds::{describe, SecretKindView, SECRET_TYPE_URL};
    use tokio::sync::mpsc;

    const STREAM_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";
    const FETCH_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets";
    const SPIFFE_ID: &str = "spiffe://default.default.mesh.local/workload/batch";

    fn request(node_id: &str, names: &[&str]) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(Node {
                id: node_id.into(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: SECRET_TYPE_URL.into(),
            ..Default::default()
        }
    }

    /// Opens `StreamSecrets` with `first`, as Envoy does: no token, no security header.
    async fn open(
        grpc: &mut tonic::client::Grpc<Channel>,
        first: DiscoveryRequest,
    ) -> Result<(mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>), Status> {
        let (requests, queue) = mpsc::channel(4);
        requests.send(first).await.expect("queued");
        grpc.ready().await.expect("ready");
        let responses = grpc
            .streaming(
                Request::new(tokio_stream::wrappers::ReceiverStream::new(queue)),
                STREAM_SECRETS.parse().expect("a path"),
                ProstCodec::<DiscoveryRequest, DiscoveryResponse>::default(),
            )
            .await?
            .into_inner();
        Ok((requests, responses))
    }

    /// The resource names of a response, each with what it holds: the leaf's URI SAN for a
    /// certificate, the trust domains for a validation context.
    fn contents(response: &DiscoveryResponse) -> Vec<(String, String)> {
        let secrets = meshca_sds::decode_secrets(response).expect("the secrets decode");
        secrets
            .iter()
            .map(|secret| {
                let content = match describe(secret).kind {
                    SecretKindView::TlsCertificate {
                        certificate_chain_pem,
                        ..
                    } => {
                        let der = pem::parse(&certificate_chain_pem).expect("a PEM chain");
                        let (_, leaf) =
                            x509_parser::parse_x509_certificate(der.contents()).expect("a leaf");
                        let san = leaf
                            .subject_alternative_name()
                            .expect("SANs parse")
                            .expect("a SAN extension");
                        format!("{:?}", san.value.general_names)
                    }
                    other => format!("{other:?}"),
                };
                (secret.name.clone(), content)
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_envoy_on_the_workload_socket_gets_its_registrations_identity_by_spire_names() {
        let mine = my_uid_selector();
        let fixture = Fixture::start(&registration("batch", &format!("[{mine}]"), "main")).await;
        let mut grpc = fixture.client().await;
        let names = ["default", SPIFFE_ID, "ROOTCA", "ALL"];
        // The node id is whatever the Envoy was given: it is not a `<mesh>.<name>` of meshca's.
        let (requests, mut responses) = open(&mut grpc, request("envoy-on-a-vm", &names))
            .await
            .expect("the stream opens without a token");
        let first = next(&mut responses).await.expect("the first response");
        let served = contents(&first);
        let served_names: Vec<&str> = served.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(served_names, names, "every name asked, as asked");
        for (name, content) in &served[..2] {
            assert!(content.contains(SPIFFE_ID), "{name}: {content}");
        }
        for (name, content) in &served[2..] {
            assert!(
                content.contains("default.default.mesh.local"),
                "{name} holds the mesh's trust domain: {content}"
            );
        }
        // An ACK with another node id is accepted: the stream stays open and serves on.
        let mut ack = request("renamed-envoy", &names);
        ack.version_info = first.version_info.clone();
        ack.response_nonce = first.nonce.clone();
        requests.send(ack).await.expect("the ACK is queued");

        // The admin API lists the stream under the caller's registration.
        let listed = admin_json(fixture.daemon.admin_addr, "/api/workloads").await;
        let streams = &listed[0]["streams"];
        assert_eq!(streams[0]["method"], "SDS", "{listed}");
        assert_eq!(streams[0]["pid"], std::process::id());

        // FetchSecrets too, without a token.
        grpc.ready().await.expect("ready");
        let fetched: DiscoveryResponse = grpc
            .unary(
                Request::new(request("", &["default"])),
                FETCH_SECRETS.parse().expect("a path"),
                ProstCodec::default(),
            )
            .await
            .expect("fetched")
            .into_inner();
        assert!(contents(&fetched)[0].1.contains(SPIFFE_ID));

        // A registration that names a binary digest and could match this caller: its digest was not
        // computed when it was attested (nothing wanted it), so the stream ends with UNAVAILABLE and
        // the reconnecting Envoy is attested again, digest included.
        let digest = format!("unix:sha256:{}", "0".repeat(64));
        fixture
            .set_registrations(&format!(
                "{}---\n{}",
                registration("batch", &format!("[{mine}]"), "main"),
                registration("batch-digest", &format!("[{mine}, {digest}]"), "digest"),
            ))
            .await;
        loop {
            match next(&mut responses).await {
                Ok(_) => continue,
                Err(status) => {
                    assert_eq!(status.code(), Code::Unavailable, "{status}");
                    assert!(status.message().contains("digest"), "{status}");
                    break;
                }
            }
        }
        drop(requests);
        let (requests, mut responses) = open(&mut grpc, request("envoy-on-a-vm", &names))
            .await
            .expect("the stream opens again");
        let again = next(&mut responses).await.expect("served again");
        assert!(contents(&again)[0].1.contains(SPIFFE_ID));

        // Its registration removed, the stream ends with PERMISSION_DENIED and no new one opens.
        fixture
            .set_registrations(&registration("other", "[unix:uid:4000000]", "x"))
            .await;
        loop {
            match next(&mut responses).await {
                Ok(_) => continue,
                Err(status) => {
                    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
                    break;
                }
            }
        }
        let refused = match open(&mut grpc, request("envoy-on-a-vm", &names)).await {
            Ok((_requests, mut responses)) => next(&mut responses).await.map(|_| ()),
            Err(status) => Err(status),
        };
        assert_eq!(code_of(refused), Code::PermissionDenied);
        drop(requests);
        fixture.daemon.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_name_is_refused_on_a_fetch_and_another_proxys_node_id_gains_nothing() {
        let mine = my_uid_selector();
        let fixture = Fixture::start(&registration("batch", &format!("[{mine}]"), "main")).await;
        let grpc = fixture.client().await;
        // A node id naming another proxy of the mesh changes nothing: the caller is still batch-1.
        let fetch = |names: &'static [&'static str]| {
            let mut grpc = grpc.clone();
            async move {
                grpc.ready().await.expect("ready");
                grpc.unary(
                    Request::new(request("default.someone-else", names)),
                    FETCH_SECRETS.parse().expect("a path"),
                    ProstCodec::<DiscoveryRequest, DiscoveryResponse>::default(),
                )
                .await
                .map(tonic::Response::into_inner)
            }
        };
        let own = fetch(&["default"]).await.expect("served");
        assert!(contents(&own)[0].1.contains(SPIFFE_ID));
        let unknown = fetch(&["spiffe://default.default.mesh.local/workload/someone-else"]).await;
        assert_eq!(code_of(unknown), Code::NotFound);
        fixture.daemon.stop().await;
    }
}

mod rust_spiffe {
    //! The Workload API socket driven by rust-spiffe's client (the `spiffe` crate), as a Rust
    //! application would: it checks what it parses, and this test checks what it does not.

    use super::*;
    use spiffe::{SpiffeId, TrustDomain, WorkloadApiClient};

    const TRUST_DOMAIN: &str = "default.default.mesh.local";
    const SPIFFE_ID: &str = "spiffe://default.default.mesh.local/workload/batch";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rust_spiffe_gets_the_svid_bundles_and_jwt_svids_of_its_registration() {
        let fixture = Fixture::start(&jwt_registration()).await;
        let client = WorkloadApiClient::connect_to(format!("unix://{}", fixture.socket.display()))
            .await
            .expect("rust-spiffe connects to the socket");

        let svid = tokio::time::timeout(TIMEOUT, client.fetch_x509_svid())
            .await
            .expect("in time")
            .expect("an X.509-SVID");
        assert_eq!(svid.spiffe_id().to_string(), SPIFFE_ID);
        assert_eq!(svid.hint(), Some("main"));
        // rust-spiffe does not check that the key is the leaf's: this test does.
        let (_, leaf) =
            x509_parser::parse_x509_certificate(svid.leaf().as_bytes()).expect("the leaf parses");
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            svid.private_key().as_bytes(),
            &ring::rand::SystemRandom::new(),
        )
        .expect("the key is PKCS#8 P-256");
        use ring::signature::KeyPair;
        assert_eq!(
            key.public_key().as_ref(),
            leaf.public_key().subject_public_key.data.as_ref(),
            "the key is the leaf's"
        );

        // The leaf's issuer is in the trust domain's bundle, and its signature verifies with it.
        let bundles = client
            .fetch_x509_bundles()
            .await
            .expect("the X.509 bundles");
        let domain = TrustDomain::new(TRUST_DOMAIN).expect("a trust domain");
        let bundle = bundles.get(&domain).expect("the SVID's trust domain");
        let issued_by_bundle = bundle.authorities().iter().any(|ca| {
            let (_, ca) = x509_parser::parse_x509_certificate(ca.as_bytes()).expect("a CA");
            ca.subject() == leaf.issuer() && leaf.verify_signature(Some(ca.public_key())).is_ok()
        });
        assert!(issued_by_bundle, "a CA of the bundle signed the leaf");

        // A JWT-SVID for an audience, which the server validates for that audience only.
        let id = SpiffeId::new(SPIFFE_ID).expect("a SPIFFE ID");
        let token = client
            .fetch_jwt_token(["billing"], Some(&id))
            .await
            .expect("a JWT-SVID");
        let validated = client
            .validate_jwt_token("billing", &token)
            .await
            .expect("it validates for its audience");
        assert_eq!(validated.spiffe_id().to_string(), SPIFFE_ID);
        assert!(client.validate_jwt_token("other", &token).await.is_err());
        let jwt_bundles = client.fetch_jwt_bundles().await.expect("the JWT bundles");
        let kid = validated.key_id().to_owned();
        let jwt_bundle = jwt_bundles
            .get(&domain)
            .expect("the trust domain's JWT bundle");
        assert!(
            jwt_bundle.find_jwt_authority(&kid).is_some(),
            "the signing key {kid} is in the bundle"
        );
        fixture.daemon.stop().await;
    }
}

/// Sets the creation time of JWT signing key `number` of the mesh's trust domain, in the keystore of
/// a stopped daemon's data directory under `root`: as if the key had been made that long ago.
fn set_jwt_key_created(root: &Path, number: u64, created: std::time::SystemTime) {
    use meshca_keystore::Keystore as _;
    let keystore =
        meshca_keystore::FileKeystore::open(&root.join("data").join("keystore")).expect("opens");
    let name = format!("jwt-svid/{TRUST_DOMAIN}/{number}.json");
    assert!(
        keystore.get_public(&name).expect("reads").is_some(),
        "{name} exists"
    );
    let ms = created
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    keystore
        .put_public(&name, format!("{{\"created_unix_ms\":{ms}}}").as_bytes())
        .expect("writes");
}

/// The `kid` in a JWT-SVID's header.
fn kid_of(token: &str) -> String {
    jws_part(token, 0)["kid"]
        .as_str()
        .expect("a kid")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_validates_after_its_key_was_rotated_and_not_after_the_key_retired() {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    let fixture = Fixture::start(&jwt_registration()).await;
    let mut grpc = fixture.client().await;
    let old = fetch_jwt(&mut grpc, audiences(&["a"]))
        .await
        .expect("a JWT-SVID")
        .svids
        .remove(0)
        .svid;
    let first = kid_of(&old);
    drop(grpc);
    fixture.daemon.stop().await;

    // Key 1 made almost a lifetime (the default, a day) ago: its successor is due, it still signs.
    let now = std::time::SystemTime::now();
    set_jwt_key_created(fixture._root.path(), 1, now - DAY + Duration::from_secs(30));
    let fixture = Fixture::start_in(fixture._root, |_| {}).await;
    let mut grpc = fixture.client().await;
    let bundle = jwks(&mut grpc).await;
    assert_eq!(bundle.keys().len(), 2, "key 2 is published beside key 1");
    assert!(bundle.get(&first).is_some());
    let new = fetch_jwt(&mut grpc, audiences(&["b"]))
        .await
        .expect("a JWT-SVID")
        .svids
        .remove(0)
        .svid;
    let second = kid_of(&new);
    assert_ne!(second, first, "key 2 signs once it may");
    assert!(bundle.get(&second).is_some());
    let validated = validate_jwt(&mut grpc, "a", &old)
        .await
        .expect("a token of the old key still validates");
    assert_eq!(
        validated.spiffe_id,
        format!("spiffe://{TRUST_DOMAIN}/workload/batch")
    );
    validate_jwt(&mut grpc, "b", &new)
        .await
        .expect("a token of the new key validates");
    let status = admin_json(fixture.daemon.admin_addr, "/api/status").await;
    let keys = status["jwt_keys"].as_array().expect("jwt_keys listed");
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in keys {
        assert_eq!(key["trust_domain"], TRUST_DOMAIN);
        assert_eq!(key["signing"], key["kid"] == second.as_str(), "{key}");
        for field in ["created", "signs_from", "signs_until", "retires_at"] {
            assert!(key[field].is_string(), "{field}: {key}");
        }
        assert!(key.get("pkcs8").is_none() && key.get("d").is_none());
    }
    drop(grpc);
    fixture.daemon.stop().await;

    // Key 1 made so long ago that every token it may have signed has expired: the start retires it.
    set_jwt_key_created(fixture._root.path(), 1, now - 3 * DAY);
    let fixture = Fixture::start_in(fixture._root, |_| {}).await;
    let mut grpc = fixture.client().await;
    let bundle = jwks(&mut grpc).await;
    assert_eq!(bundle.keys().len(), 1);
    assert!(bundle.get(&second).is_some());
    let refused = validate_jwt(&mut grpc, "a", &old).await;
    assert_eq!(
        code_of(refused),
        Code::InvalidArgument,
        "its key is retired"
    );
    validate_jwt(&mut grpc, "b", &new)
        .await
        .expect("a token of the new key validates");
    drop(grpc);
    fixture.daemon.stop().await;
}

/// A child as uid and gid 65534 (nobody) that opens `connections` connections to the socket, sends
/// each the HTTP/2 preface and a SETTINGS frame, and reports how many the server answered (accepted)
/// and how many it closed at once; it keeps the answered ones open until its stdin closes.
fn unregistered_holder(socket: &Path, connections: usize) -> (std::process::Child, String) {
    use std::io::BufRead as _;
    let script = "import socket, sys\n\
         held, shed = [], 0\n\
         for _ in range(int(sys.argv[2])):\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   s.connect(sys.argv[1])\n\
         \x20   try:\n\
         \x20       s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))\n\
         \x20       answered = s.recv(9)\n\
         \x20   except OSError:\n\
         \x20       answered = b''\n\
         \x20   if answered:\n\
         \x20       held.append(s)\n\
         \x20   else:\n\
         \x20       shed += 1\n\
         print(f'held {len(held)} shed {shed}', flush=True)\n\
         sys.stdin.read()\n";
    let mut child = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", script])
        .arg(socket)
        .arg(connections.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawning the unregistered caller");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("its stdout"))
        .read_line(&mut line)
        .expect("reading its report");
    (child, line.trim().to_owned())
}

/// An unregistered user holding every connection it can (1,030 in the finding) takes at most its
/// share (`limits.workloadConnectionsPerUid`); a registered caller of another uid is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_take_every_connection_from_a_registered_caller() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs a caller as another user: run it as root (CI does)"
    );
    let registrations = registration("batch", &format!("[{}]", my_uid_selector()), "main");
    let fixture = Fixture::start_tuned(&registrations, |settings| {
        settings.limits.workload_connections = 8;
        settings.limits.workload_connections_per_uid = 4;
        // The held connections must outlive the test, not close for want of a stream.
        settings.limits.connect_timeout = meshca_config::Duration::from_secs(600);
    })
    .await;
    // Let user 65534 reach the socket (mode 0666) through the test's private directory.
    let dir = fixture.socket.parent().expect("the socket's directory");
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let (mut holder, report) =
        tokio::task::block_in_place(|| unregistered_holder(&fixture.socket, 12));
    assert_eq!(report, "held 4 shed 8", "one user's share of 8 is 4");
    let mut grpc = fixture.client().await;
    let mut svids = stream::<_, X509SvidResponse>(
        &mut grpc,
        paths::FETCH_X509_SVID,
        with_header(X509SvidRequest {}),
    )
    .await
    .expect("the registered caller's stream opens");
    next(&mut svids)
        .await
        .expect("the registered caller is served");
    drop(holder.stdin.take());
    holder.wait().expect("reaping the holder");
    fixture.daemon.stop().await;
}

/// A caller that matches no registration gets `PERMISSION_DENIED`, then its connection is closed
/// rather than kept for the idle timeout (it would only hold a connection slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_callers_connection_closes_after_its_refusal() {
    let fixture = Fixture::start_tuned(
        &registration("other", "[unix:uid:4000000]", "x"),
        |settings| {
            settings.limits.workload_idle_timeout = meshca_config::Duration::from_secs(600);
        },
    )
    .await;
    let io = tokio::net::UnixStream::connect(&fixture.socket)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(io).await.expect("HTTP/2");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::post(format!("http://localhost{}", paths::FETCH_X509_SVID))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("workload.spiffe.io", "true")
        .body(())
        .expect("a request");
    let (response, mut body) = client.send_request(request, false).expect("sent");
    // An empty X509SVIDRequest.
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .expect("the message");
    let response = response.await.expect("answered");
    let status = response
        .headers()
        .get("grpc-status")
        .expect("a trailers-only answer")
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert_eq!(status, (Code::PermissionDenied as i32).to_string());
    tokio::time::timeout(TIMEOUT, connection)
        .await
        .expect("the daemon closes the connection well before its idle timeout")
        .expect("the connection task")
        .ok();
    fixture.daemon.stop().await;
}
