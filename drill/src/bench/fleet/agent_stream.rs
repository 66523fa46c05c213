//! One simulated agent of `bench agents`: the `Sync` stream of a `meshca agent` (see
//! docs/agent-protocol.md), over a connection of the fleet (see [`super`]). Like the real agent it
//! says Hello, asks for a certificate over a key of its own for every registration the server wants a key
//! for (one key ahead: again after each certificate over its last key), and acknowledges each state; it
//! has no Workload API stream open, so, as the real agent then does, it acknowledges at once. Keys are
//! made for their requests only and dropped: the bench never serves them.
//!
//! An agent is reached by a rotation when a state's bundle of its mesh holds a CA outside the steady
//! state's, and renewed when every one of its registrations has a certificate issued by such a CA.

use std::collections::HashMap;

use anyhow::{anyhow, Context};
use bytes::Bytes;
use meshca_agent_server::proto::{
    agent_message, Ack, AgentMessage, AgentState, Hello, KeyRequest, KeyRequests, PROTOCOL_VERSION,
};
use meshca_agent_server::KEY_REQUESTS_PER_MESSAGE;
use rustls_pki_types::CertificateDer;

use super::super::harness::MESH;
use super::{grpc_frame, issuer_of, note, GrpcCall, Progress, Seen};

/// An agent of the fleet: its token, which names it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AgentPlan {
    /// The agent token.
    pub token: String,
}

/// The URI of `Sync` ([`paths::SYNC`] on the fleet's authority).
const SYNC_URI: &str = "http://localhost/meshca.agent.v1.Agent/Sync";

/// Opens agent `index`'s stream on `connection` and plays it until it fails; reports into `progress`.
pub(super) async fn run(
    index: usize,
    connection: h2::client::SendRequest<Bytes>,
    plan: AgentPlan,
    progress: &Progress,
) -> anyhow::Result<()> {
    let authorization = format!("Bearer {}", plan.token.trim());
    let call = GrpcCall {
        method: "Sync",
        uri: SYNC_URI,
        header: ("authorization", &authorization),
        first: grpc_frame(&message(agent_message::Message::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            agent_version: "meshca bench".to_owned(),
        })))?,
        end_stream: false,
    };
    let (mut requests, mut responses) = call.open(connection).await?;
    // Per registration, the key id of the certificate it had when a key was last asked for it.
    let mut asked: HashMap<String, Vec<u8>> = HashMap::new();
    let mut ready = false;
    loop {
        let state: AgentState = responses.message(progress).await?;
        let mut wanted = Vec::new();
        for registration in state.registrations.iter().filter(|r| r.wants_key) {
            let held = registration
                .identity
                .as_ref()
                .map(|i| i.key_id.clone())
                .unwrap_or_default();
            if asked.get(&registration.name) == Some(&held) {
                continue;
            }
            wanted.push(KeyRequest {
                mesh: registration.mesh.clone(),
                registration: registration.name.clone(),
                csr: csr()?,
                replace_now: false,
            });
            asked.insert(registration.name.clone(), held);
        }
        for chunk in wanted.chunks(KEY_REQUESTS_PER_MESSAGE) {
            let keys = agent_message::Message::Keys(KeyRequests {
                requests: chunk.to_vec(),
            });
            requests
                .send_data(grpc_frame(&message(keys))?, false)
                .context("the Sync stream closed")?;
        }
        let ack = agent_message::Message::Ack(Ack {
            version: state.version,
            streams: Vec::new(),
        });
        requests
            .send_data(grpc_frame(&message(ack))?, false)
            .context("the Sync stream closed")?;
        let seen = inspect(&state, progress)?;
        let complete = seen.leaf_issuer.is_some();
        note(index, &seen, progress);
        if !ready && complete {
            ready = true;
            progress.stream_ready();
        }
    }
}

fn message(message: agent_message::Message) -> AgentMessage {
    AgentMessage {
        message: Some(message),
    }
}

/// A certificate request over a fresh P-256 key (the server's default key algorithm), naming nothing:
/// the server takes the SPIFFE ID from the registration.
fn csr() -> anyhow::Result<Vec<u8>> {
    let key = rcgen::KeyPair::generate().map_err(|e| anyhow!("cannot make a key: {e}"))?;
    let request = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .map_err(|e| anyhow!("cannot sign a certificate request: {e}"))?;
    Ok(request.der().to_vec())
}

/// The bench mesh's bundle, and the issuer of the registrations' certificates when every one has a
/// certificate and one CA issued them all.
fn inspect(state: &AgentState, progress: &Progress) -> anyhow::Result<Seen> {
    let trust = state
        .meshes
        .get(MESH)
        .ok_or_else(|| anyhow!("a state without the trust of mesh {MESH}"))?;
    let mut authorities: Vec<&Vec<u8>> = trust
        .by_trust_domain
        .values()
        .flat_map(|b| &b.authorities)
        .collect();
    authorities.sort();
    let bytes = authorities
        .iter()
        .flat_map(|der| der.iter().copied())
        .collect();
    let bundle = progress.bundles().cached(bytes, |_| {
        Ok(authorities
            .iter()
            .map(|der| CertificateDer::from(der.to_vec()))
            .collect())
    })?;
    let mut issuers = state.registrations.iter().map(|r| {
        let identity = r.identity.as_ref()?;
        let leaf = identity.certificate_chain.first()?;
        issuer_of(leaf).ok()
    });
    let first = issuers.next().flatten();
    let leaf_issuer = match first {
        Some(issuer) if issuers.all(|i| i.as_ref() == Some(&issuer)) => Some(issuer),
        _ => None,
    };
    Ok(Seen {
        bundle: Some(bundle),
        leaf_issuer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uri_is_the_protocols_path() {
        let path = meshca_agent_server::proto::paths::SYNC;
        assert_eq!(SYNC_URI, format!("http://localhost{path}"));
    }
}
