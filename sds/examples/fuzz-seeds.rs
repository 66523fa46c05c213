//! Writes the seeds of the transport's and SDS's fuzz targets (docs/fuzzing.md) into
//! `<workspace>/{serve,sds}/fuzz/corpus/<target>/`:
//! the header block grpcio 1.85 sent on the unix socket (captured), whole and split over
//! CONTINUATION frames, and a first request shaped like Envoy's (its node with the extension list),
//! framed for gRPC and bare, as a SotW and a delta request.
//!
//! `cargo run -p meshca-sds --example fuzz-seeds -- .`

use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use prost::Message;

/// The header block grpcio 1.85 sent on a unix socket (captured): `:path`, `:authority` (the
/// socket's path), `:method POST`, `:scheme http`.
const GRPCIO_BLOCK: &str = "40053a70617468042f612f62400a3a617574686f7269747918746d70253246636170736f636b2532467364732e736f636b8386";
const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workspace = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: fuzz-seeds <workspace dir>")?,
    );
    let (serve, fuzz) = (workspace.join("serve/fuzz"), workspace.join("sds/fuzz"));
    let block: Vec<u8> = (0..GRPCIO_BLOCK.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&GRPCIO_BLOCK[i..i + 2], 16))
        .collect::<Result<_, _>>()?;
    let settings = frame(0x4, 0, 0, &[]);
    let whole = [
        settings.clone(),
        frame(0x1, 0x4, 1, &block),
        frame(0x0, 0x1, 1, &[0; 5]),
    ]
    .concat();
    let (a, b) = block.split_at(20);
    let split = [
        settings,
        frame(0x1, 0, 1, a),
        frame(0x9, 0, 1, &[]),
        frame(0x9, 0x4, 1, b),
    ]
    .concat();
    // Limit byte 0 (16 KiB), then read sizes.
    write(
        &serve,
        "header_fixup",
        "grpcio",
        &[&[0, 0, 3, 40][..], &whole].concat(),
    )?;
    write(
        &serve,
        "header_fixup",
        "grpcio-continuation",
        &[&[0, 1, 255, 7][..], &split].concat(),
    )?;

    let sotw = DiscoveryRequest {
        node: Some(envoy_node()),
        resource_names: vec![
            "identity_cert:mesh:default".to_owned(),
            "mesh_ca:default".to_owned(),
        ],
        type_url: SECRET.to_owned(),
        ..Default::default()
    }
    .encode_to_vec();
    let delta = DeltaDiscoveryRequest {
        node: Some(envoy_node()),
        type_url: SECRET.to_owned(),
        resource_names_subscribe: vec!["identity_cert:mesh:default".to_owned()],
        initial_resource_versions: [("mesh_ca:default".to_owned(), "3".to_owned())].into(),
        ..Default::default()
    }
    .encode_to_vec();
    for (name, kind, message) in [("envoy-sotw", 0, &sotw), ("envoy-delta", 1, &delta)] {
        let framed = [&[0][..], &(message.len() as u32).to_be_bytes(), message].concat();
        // Limit byte 255 (4080 bytes), the kind, then data frame sizes.
        write(
            &fuzz,
            "grpc_requests",
            name,
            &[&[255, kind, 40, 9, 200][..], &framed].concat(),
        )?;
        write(
            &fuzz,
            "request_trimmer",
            name,
            &[&[kind, 30, 2, 128][..], message].concat(),
        )?;
    }
    Ok(())
}

/// A node as Envoy sends it in a stream's first request.
fn envoy_node() -> Node {
    Node {
        id: "default.web-1".to_owned(),
        cluster: "web".to_owned(),
        metadata: Some(Struct {
            fields: [(
                "dataplane.token".to_owned(),
                Value {
                    kind: Some(Kind::StringValue("x".repeat(40))),
                },
            )]
            .into(),
        }),
        user_agent_name: "envoy".to_owned(),
        extensions: (0..24)
            .map(|i| Extension {
                name: format!("envoy.filters.http.extension_{i:02}"),
                category: "envoy.filters.http".to_owned(),
                ..Default::default()
            })
            .collect(),
        client_features: vec!["envoy.lb.does_not_support_overprovisioning".to_owned()],
        ..Default::default()
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn write(fuzz: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = fuzz.join("corpus").join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("seed-{name}")), bytes)
}
