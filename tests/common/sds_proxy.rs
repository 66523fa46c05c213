//! A hand-driven SDS proxy: one real `StreamSecrets` stream subscribed to `default` and
//! `system_trust_bundle`, which records every push and ACKs only when the test says so.
//!
//! Needs a multi-threaded tokio runtime (`#[tokio::test(flavor = "multi_thread")]`): minting the token
//! runs the CLI inside `block_in_place`.

use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use meshca_identity::SpiffeId;
use meshca_sds::{decode_secrets, describe, SdsClient, SecretKindView, SECRET_TYPE_URL};
use tokio::sync::mpsc;
use tokio::task::{block_in_place, JoinHandle};
use tokio_stream::wrappers::ReceiverStream;

use super::{pem_certs, Env};

/// The identity secret the proxy subscribes to.
pub const IDENTITY: &str = "default";
/// The trust secret the proxy subscribes to.
pub const TRUST: &str = "system_trust_bundle";
/// Upper bound for a push a test expects (the daemon promises 100 ms; this is a shared debug build).
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// One response as the proxy understood it.
#[derive(Clone, Debug)]
pub struct Received {
    pub version: String,
    pub nonce: String,
    /// The `default` certificate chain (DER), leaf first.
    pub chain: Vec<Vec<u8>>,
    /// The trust domains of the SPIFFE validator.
    pub trust_domains: Vec<String>,
    /// Every CA (DER) of the SPIFFE validator's trust bundles.
    pub bundle: Vec<Vec<u8>>,
}

impl Received {
    /// Whether the bundle holds `ca` (DER).
    pub fn trusts(&self, ca: &[u8]) -> bool {
        self.bundle.iter().any(|c| c == ca)
    }
}

/// Reads a response: both secrets must be there (state of the world), the trust as a SPIFFE validator.
fn understand(proxy: &str, response: &DiscoveryResponse) -> Received {
    let secrets =
        decode_secrets(response).unwrap_or_else(|e| panic!("{proxy}: undecodable response: {e}"));
    let mut chain = None;
    let mut trust = None;
    for secret in &secrets {
        match (secret.name.as_str(), describe(secret).kind) {
            (
                IDENTITY,
                SecretKindView::TlsCertificate {
                    certificate_chain_pem,
                    ..
                },
            ) => chain = Some(pem_certs(&certificate_chain_pem)),
            (
                TRUST,
                SecretKindView::ValidationContext {
                    spiffe_trust_domains: Some(domains),
                    ..
                },
            ) => trust = Some(domains),
            (name, kind) => panic!("{proxy}: unexpected secret {name:?}: {kind:?}"),
        }
    }
    let domains = trust.unwrap_or_else(|| panic!("{proxy}: a response without {TRUST:?}"));
    Received {
        version: response.version_info.clone(),
        nonce: response.nonce.clone(),
        chain: chain.unwrap_or_else(|| panic!("{proxy}: a response without {IDENTITY:?}")),
        trust_domains: domains.keys().cloned().collect(),
        bundle: domains.values().flat_map(|p| pem_certs(p)).collect(),
    }
}

/// A proxy driving one `StreamSecrets` stream by hand.
///
/// Every push is checked on arrival: its certificate must verify (as an SVID for the expected SPIFFE ID)
/// against the bundle in the same response, and a changed certificate also against the bundle this stream
/// received before it (trust before identity, as the stream sees it).
#[derive(Debug)]
pub struct SdsProxy {
    pub name: String,
    expected_id: SpiffeId,
    /// Kept so that dropping the proxy closes its connection.
    _client: SdsClient,
    requests: Option<mpsc::Sender<DiscoveryRequest>>,
    responses: mpsc::UnboundedReceiver<Result<DiscoveryResponse, tonic::Status>>,
    reader: JoinHandle<()>,
    /// Every response, in order.
    pub received: Vec<Received>,
    /// The version of the last response ACKed.
    pub acked: Option<String>,
}

impl SdsProxy {
    /// Mints a token (`meshca token` with `token_args`, e.g. `--tag kuma.io/service=web`) for
    /// `<mesh>.<name>` and opens its stream over the unix socket. Its certificates must carry
    /// `expected_id`.
    pub async fn connect(
        env: &Env,
        mesh: &str,
        name: &str,
        token_args: &[&str],
        expected_id: &str,
    ) -> SdsProxy {
        let expected_id = SpiffeId::parse(expected_id)
            .unwrap_or_else(|e| panic!("{expected_id:?} is not a SPIFFE ID: {e}"));
        let token = block_in_place(|| env.token(mesh, name, token_args));
        let client = SdsClient::connect(&env.sds_unix(), None, token.token.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: cannot connect: {e}"));
        let (requests, queue) = mpsc::channel(8);
        let first = DiscoveryRequest {
            node: Some(Node {
                id: format!("{mesh}.{name}"),
                ..Default::default()
            }),
            resource_names: vec![IDENTITY.to_owned(), TRUST.to_owned()],
            type_url: SECRET_TYPE_URL.to_owned(),
            ..Default::default()
        };
        requests
            .send(first)
            .await
            .expect("the queue was just created and its receiver is held");
        let mut call = tonic::Request::new(ReceiverStream::new(queue));
        client.authorize(&mut call);
        let mut inbound = client
            .raw()
            .stream_secrets(call)
            .await
            .unwrap_or_else(|e| panic!("{name}: StreamSecrets refused: {e}"))
            .into_inner();
        let (tx, responses) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(response)) => {
                        if tx.send(Ok(response)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(status) => {
                        let _ = tx.send(Err(status));
                        return;
                    }
                }
            }
        });
        SdsProxy {
            name: name.to_owned(),
            expected_id,
            _client: client,
            requests: Some(requests),
            responses,
            reader,
            received: Vec::new(),
            acked: None,
        }
    }

    /// The newest response.
    pub fn last(&self) -> &Received {
        self.received
            .last()
            .unwrap_or_else(|| panic!("{}: nothing received yet", self.name))
    }

    fn take(&mut self, response: Result<DiscoveryResponse, tonic::Status>) {
        let name = &self.name;
        let response = response.unwrap_or_else(|s| panic!("{name}: the stream failed: {s}"));
        let now = understand(name, &response);
        let at = SystemTime::now();
        if let Some(before) = self.received.last() {
            if before.chain != now.chain {
                meshca_ca::verify_svid(&now.chain, &before.bundle, &self.expected_id, at)
                    .unwrap_or_else(|e| {
                        panic!(
                            "{name}: pushed a certificate the bundle it held before does not trust: {e}"
                        )
                    });
            }
        }
        meshca_ca::verify_svid(&now.chain, &now.bundle, &self.expected_id, at).unwrap_or_else(
            |e| panic!("{name}: pushed a certificate its own response does not trust: {e}"),
        );
        self.received.push(now);
    }

    /// Awaits the next push (at most [`PUSH_TIMEOUT`]).
    pub async fn next(&mut self, what: &str) -> &Received {
        let response = tokio::time::timeout(PUSH_TIMEOUT, self.responses.recv())
            .await
            .unwrap_or_else(|_| panic!("{}: no push within {PUSH_TIMEOUT:?} ({what})", self.name))
            .unwrap_or_else(|| panic!("{}: the stream ended ({what})", self.name));
        self.take(response);
        self.last()
    }

    /// Awaits pushes until one satisfies `wanted` (earlier ones are recorded, not ACKed), for at most
    /// `within`.
    pub async fn next_until(
        &mut self,
        what: &str,
        within: Duration,
        wanted: impl Fn(&Received) -> bool,
    ) -> Received {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let response = tokio::time::timeout_at(deadline, self.responses.recv())
                .await
                .unwrap_or_else(|_| panic!("{}: no push of {what} within {within:?}", self.name))
                .unwrap_or_else(|| panic!("{}: the stream ended before {what}", self.name));
            self.take(response);
            if wanted(self.last()) {
                return self.last().clone();
            }
        }
    }

    /// Records what has already arrived, without waiting.
    pub fn drain(&mut self) {
        while let Ok(response) = self.responses.try_recv() {
            self.take(response);
        }
    }

    /// ACKs the newest response (an ACK of an older nonce would be ignored, as for Envoy).
    pub async fn ack(&mut self) {
        self.drain();
        let last = self.last().clone();
        let reply = DiscoveryRequest {
            version_info: last.version.clone(),
            resource_names: vec![IDENTITY.to_owned(), TRUST.to_owned()],
            type_url: SECRET_TYPE_URL.to_owned(),
            response_nonce: last.nonce,
            ..Default::default()
        };
        let requests = self
            .requests
            .as_ref()
            .expect("ack() is only called while connected");
        requests
            .send(reply)
            .await
            .unwrap_or_else(|_| panic!("{}: the request stream closed", self.name));
        self.acked = Some(last.version);
    }

    /// Drops the stream and its connection, as a proxy that goes away.
    pub fn disconnect(mut self) {
        self.requests = None;
        self.reader.abort();
    }
}

impl Drop for SdsProxy {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
