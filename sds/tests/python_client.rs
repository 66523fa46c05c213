//! An independent client: Python grpcio (grpc-core) over the unix socket and over TLS.
//! grpc-core may send the socket path as `:authority` (STACK-NOTES pitfall 4); the server
//! must still answer. Skipped with a notice when python3 with grpcio is not installed.

mod common;

use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use prost::Message;

const SCRIPT: &str = r#"
import sys, grpc
target, token, request_hex, ca_path = sys.argv[1:5]
options = []
if ca_path == "-":
    channel = grpc.insecure_channel(target)
else:
    with open(ca_path, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    channel = grpc.secure_channel(target, creds)
fetch = channel.unary_unary("/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets")
try:
    # Twice on one connection: the second request refers to the HPACK dynamic table.
    for _ in range(2):
        response = fetch(bytes.fromhex(request_hex), metadata=[("authorization", "Bearer " + token)], timeout=10)
except grpc.RpcError as e:
    sys.stdout.write("ERROR " + str(e.code()) + " " + str(e.details()))
    sys.exit(0)
sys.stdout.write(response.hex())
"#;

fn grpcio_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import grpc"])
        .output()
        .is_ok_and(|output| output.status.success())
}

async fn python_fetch(
    harness: &Harness,
    target: &str,
    ca_path: &str,
    node_id: &str,
    resources: &[&str],
) -> Result<DiscoveryResponse, String> {
    let script = harness.dir.path().join("fetch.py");
    std::fs::write(&script, SCRIPT).expect("script");
    let (token, _) = harness.token_for("default", "web-1");
    let request = hex_encode(&first_request(node_id, resources).encode_to_vec());
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("python3")
            .arg(&script)
            .args([target, token.as_str(), request.as_str(), ca_path])
            .output(),
    )
    .await
    .expect("python finishes")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    if let Some(error) = stdout.strip_prefix("ERROR ") {
        return Err(error.to_owned());
    }
    let bytes = hex_decode(&stdout);
    Ok(DiscoveryResponse::decode(bytes.as_slice()).expect("a DiscoveryResponse"))
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

#[tokio::test]
async fn grpcio_over_unix_socket_and_tls() {
    if !grpcio_available() {
        eprintln!("SKIPPED: python3 with grpcio is not installed (pip install grpcio)");
        return;
    }
    let harness = Harness::start().await;
    let socket = harness.unix_target.trim_start_matches("unix://").to_owned();
    for target in [format!("unix://{socket}"), format!("unix:{socket}")] {
        let response = python_fetch(
            &harness,
            &target,
            "-",
            "default.web-1",
            &["default", "ROOTCA"],
        )
        .await
        .unwrap_or_else(|error| panic!("{target}: {error}"));
        assert_eq!(
            secrets(&response).keys().collect::<Vec<_>>(),
            ["ROOTCA", "default"]
        );
    }
    let ca_path = harness.dir.path().join("ca.pem");
    std::fs::write(&ca_path, &harness.server_ca_pem).expect("CA file");
    let target = format!("localhost:{}", harness.tls_addr.port());
    let response = python_fetch(
        &harness,
        &target,
        ca_path.to_str().expect("utf-8"),
        "default.web-1",
        &["default"],
    )
    .await
    .expect("fetch over TLS");
    assert_eq!(response.resources.len(), 1);
    let error = python_fetch(
        &harness,
        &format!("unix://{socket}"),
        "-",
        "default.web-2",
        &["default"],
    )
    .await
    .expect_err("node id mismatch");
    assert!(error.contains("PERMISSION_DENIED"), "{error}");
}
