//! The console's pages as a browser gets them, during a CA rotation that one SDS stream follows: the
//! overview shows the rollout's steps and whom the waiting one waits for, the proxy's page shows what
//! its stream ACKed, and the timeline keeps the rollout once it is over.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use meshca_auth::Claims;
use meshca_daemon::Daemon;
use meshca_sds::SdsClient;
use tokio::sync::mpsc;

const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// How long a response or a page may take to show what is awaited.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `GET path` on the admin listener: the status code and the body.
async fn get(admin: SocketAddr, path: &str) -> (u16, String) {
    let response = common::admin_response(admin, path).await;
    let code = response
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{path}: no status line in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (code, body)
}

/// Polls `path` until its body satisfies `check` (the owner takes ACKs in on its own turn).
async fn until(admin: SocketAddr, path: &str, check: impl Fn(&str) -> bool) -> String {
    let poll = async {
        loop {
            let (code, body) = get(admin, path).await;
            if code == 200 && check(&body) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    match tokio::time::timeout(TIMEOUT, poll).await {
        Ok(body) => body,
        Err(_) => panic!(
            "{path} never showed what was awaited; now: {:?}",
            get(admin, path).await
        ),
    }
}

/// A stream of proxy `web-1`, subscribed to its identity and the mesh trust.
struct Proxy {
    requests: mpsc::Sender<DiscoveryRequest>,
    responses: tonic::Streaming<DiscoveryResponse>,
    names: Vec<String>,
}

impl Proxy {
    async fn connect(daemon: &Daemon, root: &Path) -> Proxy {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let tags = BTreeMap::from([("kuma.io/service".to_owned(), "web".to_owned())]);
        let claims = Claims::new_dataplane(
            "default",
            "web-1",
            BTreeMap::new(),
            tags,
            Duration::from_secs(3600),
            now,
        )
        .expect("claims");
        let token = daemon.mint_token(&claims).expect("a token");
        let target = format!("unix://{}", root.join("sds.sock").display());
        let client = SdsClient::connect(&target, None, token)
            .await
            .expect("SDS connects");
        let names = vec!["default".to_owned(), "system_trust_bundle".to_owned()];
        let (requests, responses) = client
            .open_stream("default.web-1", &names, None, 4)
            .await
            .expect("the stream opens");
        Proxy {
            requests,
            responses,
            names,
        }
    }

    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(TIMEOUT, self.responses.message())
            .await
            .expect("a response in time")
            .expect("the stream stays up")
            .expect("the stream does not end")
    }

    async fn ack(&mut self, response: &DiscoveryResponse) {
        let ack = DiscoveryRequest {
            version_info: response.version_info.clone(),
            resource_names: self.names.clone(),
            type_url: SECRET_TYPE_URL.to_owned(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        self.requests.send(ack).await.expect("the stream is open");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_follows_a_rotation_step_by_step_and_keeps_it_in_the_timeline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let resources = root.join("resources");
    std::fs::create_dir_all(&resources).expect("resources dir");
    std::fs::write(resources.join("mesh.yaml"), common::mesh("ca-1", &[])).expect("mesh");
    let daemon = common::start_daemon(root).await;
    let admin = daemon.admin_addr;

    let mut proxy = Proxy::connect(&daemon, root).await;
    let mut response = proxy.next().await;
    // Until every name resolved, the stream may get a response with part of them.
    while response.resources.len() < 2 {
        proxy.ack(&response).await;
        response = proxy.next().await;
    }
    proxy.ack(&response).await;
    let acked = response.version_info.clone();
    let page = until(admin, "/proxies/default/web-1", |b| b.contains(&acked)).await;
    assert!(page.contains("spiffe://default/web"), "{page}");
    assert!(page.contains("backend ca-1"), "{page}");
    assert!(page.contains("<code>system_trust_bundle</code>"), "{page}");
    let (code, missing) = get(admin, "/proxies/default/nobody").await;
    assert_eq!(code, 404, "{missing}");
    assert!(missing.contains("No dataplane"), "{missing}");

    // The rotation: ca-2 issues, ca-1 stays trusted. The new trust waits for web-1's ACK.
    std::fs::write(resources.join("mesh.yaml"), common::mesh("ca-2", &["ca-1"])).expect("mesh");
    common::reload(&daemon).await;
    let trust = proxy.next().await;
    let overview = get(admin, "/console/overview").await.1;
    assert!(
        overview.contains(r#"data-step="trust-before-identity" data-state="waiting""#),
        "{overview}"
    );
    assert!(
        overview.contains("default.web-1"),
        "the proxy waited for: {overview}"
    );
    assert!(
        overview.contains(r#"data-issuer="backend ca-2""#),
        "the new CA's bar shows before any proxy is on it: {overview}"
    );
    assert!(
        overview.contains(r#"data-state="in-progress""#),
        "{overview}"
    );

    // web-1 ACKs the trust, then gets and ACKs its ca-2 certificate: the rollout is over.
    proxy.ack(&trust).await;
    let last = proxy.next().await;
    proxy.ack(&last).await;
    let overview = until(admin, "/console/overview", |b| {
        b.contains(r#"data-state="idle""#) && b.contains("Last rollout")
    })
    .await;
    assert!(
        overview.contains(r#"data-step="trust-before-identity" data-state="done""#),
        "{overview}"
    );
    assert!(
        overview.contains(r#"data-step="break-last" data-state="not needed""#),
        "ca-1 is still configured: nothing to break: {overview}"
    );
    assert!(
        overview.contains(r#"backend ca-2: <span class="count">1</span>"#),
        "{overview}"
    );
    let timeline = get(admin, "/rollouts").await.1;
    for expected in [
        "<b>trust-before-identity</b> began",
        "<b>trust-before-identity</b> ended",
        "<b>identity-ack</b> began",
        "<b>identity-ack</b> ended",
    ] {
        assert!(timeline.contains(expected), "{expected}: {timeline}");
    }
    assert!(!timeline.contains("(in progress)"), "{timeline}");
    // The proxy's page shows the version it ACKed last.
    let version = last.version_info.clone();
    until(admin, "/proxies/default/web-1", |b| b.contains(&version)).await;
    daemon.stop().await;
}
