//! Writes the seeds of the `agent_messages` fuzz target (docs/fuzzing.md) into
//! `<dir>/corpus/agent_messages/`: real message sequences of an agent's `Sync` stream in the layout
//! `meshca_agent_server::fuzzing::agent_messages` reads, with certificate signing requests made here.
//!
//!   cargo run -p meshca-agent --example agent-fuzz-seeds -- agent/fuzz

use std::path::PathBuf;
use std::process::ExitCode;

use meshca_agent_server::fuzzing::{input, options, Record, MESH};
use meshca_agent_server::proto::{
    agent_message, Ack, AgentMessage, Hello, KeyRequest, KeyRequests, OpenStreams, PROTOCOL_VERSION,
};
use meshca_identity::KeyAlgorithm;
use prost::Message;
use rcgen::{CertificateParams, KeyPair, SanType};

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: agent-fuzz-seeds <fuzz dir, e.g. agent/fuzz>");
        return ExitCode::from(2);
    };
    let dir = dir.join("corpus/agent_messages");
    let seeds = match seeds() {
        Ok(seeds) => seeds,
        Err(error) => {
            eprintln!("agent-fuzz-seeds: cannot make a request: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::create_dir_all(&dir) {
        eprintln!("agent-fuzz-seeds: cannot create {}: {error}", dir.display());
        return ExitCode::FAILURE;
    }
    for (name, data) in seeds {
        let path = dir.join(format!("seed-{name}"));
        if let Err(error) = std::fs::write(&path, data) {
            eprintln!("agent-fuzz-seeds: cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn seeds() -> Result<Vec<(&'static str, Vec<u8>)>, rcgen::Error> {
    let p256 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)?;
    let web = "spiffe://default.zone/web-1";
    let web_csr = csr(&p256, &[web])?;
    let p256_opts = options(KeyAlgorithm::EcdsaP256, 0);
    let p384_opts = options(KeyAlgorithm::EcdsaP384, 0);
    Ok(vec![
        ("hello", input(p256_opts, &[hello(PROTOCOL_VERSION)])),
        (
            "hello-ack",
            input(
                p256_opts,
                &[hello(PROTOCOL_VERSION), ack(1, &[("web", 1), ("db", 0)])],
            ),
        ),
        (
            "key-request",
            input(
                p256_opts,
                &[
                    hello(PROTOCOL_VERSION),
                    keys(vec![request("web", web_csr.clone(), true)]),
                    ack(2, &[]),
                    Record::Unchanged(1),
                    Record::Send(1),
                    ack(1, &[]),
                ],
            ),
        ),
        (
            "key-requests-p384",
            input(
                p384_opts,
                &[
                    hello(PROTOCOL_VERSION),
                    keys(vec![
                        request("db", csr(&p384, &[])?, false),
                        request("other", csr(&p384, &[])?, false),
                        request("web", csr(&p384, &[web, "https://example.com/x"])?, false),
                    ]),
                    ack(2, &[("web", 3)]),
                ],
            ),
        ),
        (
            "refused-requests",
            input(
                p256_opts,
                &[
                    hello(PROTOCOL_VERSION),
                    keys(vec![request(
                        "web",
                        csr(&p256, &["spiffe://default.zone/db-1"])?,
                        false,
                    )]),
                    hello(PROTOCOL_VERSION),
                    keys(vec![request("db", web_csr.clone(), false)]),
                    hello(PROTOCOL_VERSION),
                    keys(vec![request("web", csr(&p384, &[web])?, false)]),
                    hello(PROTOCOL_VERSION),
                    keys((0..65).map(|_| request("web", Vec::new(), false)).collect()),
                ],
            ),
        ),
        (
            "sends-and-acks",
            input(
                p256_opts,
                &[
                    hello(PROTOCOL_VERSION),
                    Record::Send(0),
                    Record::Send(3),
                    Record::Unchanged(2),
                    ack(2, &[]),
                    ack(5, &[]),
                    Record::Unchanged(1),
                    ack(1, &[]),
                    ack(9, &[]),
                    Record::Reconnect,
                    hello(PROTOCOL_VERSION),
                    ack(12, &[]),
                ],
            ),
        ),
        (
            "wrong-first-messages",
            input(
                options(KeyAlgorithm::EcdsaP256, 2),
                &[
                    hello(PROTOCOL_VERSION + 1),
                    ack(1, &[]),
                    Record::Message(Vec::new()),
                    keys(vec![request("web", web_csr, false)]),
                    hello(PROTOCOL_VERSION),
                    hello(PROTOCOL_VERSION),
                ],
            ),
        ),
    ])
}

/// A certificate signing request for `key`, naming `uris` as URI SANs.
fn csr(key: &KeyPair, uris: &[&str]) -> Result<Vec<u8>, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names = uris
        .iter()
        .map(|u| Ok(SanType::URI((*u).try_into()?)))
        .collect::<Result<_, rcgen::Error>>()?;
    Ok(params.serialize_request(key)?.der().to_vec())
}

fn message(message: agent_message::Message) -> Record {
    Record::Message(
        AgentMessage {
            message: Some(message),
        }
        .encode_to_vec(),
    )
}

fn hello(protocol: u32) -> Record {
    message(agent_message::Message::Hello(Hello {
        protocol,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
    }))
}

fn ack(version: u64, streams: &[(&str, u32)]) -> Record {
    message(agent_message::Message::Ack(Ack {
        version,
        streams: streams
            .iter()
            .map(|(registration, streams)| OpenStreams {
                mesh: MESH.to_owned(),
                registration: (*registration).to_owned(),
                streams: *streams,
            })
            .collect(),
    }))
}

fn keys(requests: Vec<KeyRequest>) -> Record {
    message(agent_message::Message::Keys(KeyRequests { requests }))
}

fn request(registration: &str, csr: Vec<u8>, replace_now: bool) -> KeyRequest {
    KeyRequest {
        mesh: MESH.to_owned(),
        registration: registration.to_owned(),
        csr,
        replace_now,
    }
}
