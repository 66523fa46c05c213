//! The client side of `bench sds` and `bench workload`: many streams multiplexed over a few HTTP/2
//! connections. An SDS stream (`StreamSecrets`) ACKs every response at once, as Envoy does; a Workload
//! API stream (`FetchX509SVID`, [`workload_stream`]) only listens. Each notes when it first holds
//! what it asked for and, once a rotation is armed, when it first receives a bundle with a CA outside
//! the steady-state one (and, if it asks for its identity, a certificate from such a CA).
//!
//! The streams speak gRPC over the `h2` crate directly (length-prefixed protobuf in DATA frames), not
//! through tonic's client: the simulated clients share the machine's cores with the daemon they
//! measure, and tonic's request channel and decode buffer per stream made the client spend a third
//! more CPU than the daemon's own work needs of it. Every response is still read whole, decoded,
//! checked and, on SDS, ACKed (or NACKed) on its stream.

pub mod agent_stream;
mod workload_stream;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use futures::future::BoxFuture;
use futures::FutureExt;
use meshca_sds::{decode_secrets, describe, SecretKindView, SECRET_TYPE_URL};
use prost::Message;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use x509_parser::nom::Parser;
use x509_parser::prelude::{FromDer, X509Certificate, X509CertificateParser};

/// The identity secret a stream may ask for.
pub const IDENTITY: &str = "default";
/// The validation context every stream asks for.
pub const TRUST: &str = "system_trust_bundle";

/// One stream to open.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StreamPlan {
    /// The Envoy node id (`<mesh>.<name>`).
    pub node_id: String,
    /// The proxy's token.
    pub token: String,
    /// Whether the stream also asks for `default`.
    pub identity: bool,
}

/// Every stream of a fleet and where they go.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FleetPlan {
    /// The daemon's socket (`unix:///…`): its SDS socket, or its Workload API socket.
    pub target: String,
    /// How many HTTP/2 connections carry the streams; stream `i` uses connection `i % connections`.
    pub connections: usize,
    /// The streams.
    pub streams: Streams,
}

/// What a fleet's streams ask for.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Streams {
    /// SDS `StreamSecrets` streams, as Envoys open them.
    Sds {
        /// How many extensions the node of each first request lists ([`envoy_node`]).
        node_extensions: usize,
        /// The streams.
        streams: Vec<StreamPlan>,
    },
    /// Workload API `FetchX509SVID` streams of one process (see [`workload_stream`]): every
    /// stream receives an SVID, so every one is an identity stream unless `trust_only`.
    Workload {
        /// How many.
        count: usize,
        /// Only their trust is waited for (a federated bundle change renews no SVID).
        #[serde(default)]
        trust_only: bool,
    },
    /// Agents' `Sync` streams (see [`agent_stream`]), one per agent: each receives the
    /// certificates of the agent's registrations, so every one is an identity stream.
    Agents {
        /// The agents.
        agents: Vec<agent_stream::AgentPlan>,
    },
}

impl Streams {
    /// How many streams, and how many of them ask for an identity.
    pub(super) fn counts(&self) -> (usize, usize) {
        match self {
            Streams::Sds { streams, .. } => {
                (streams.len(), streams.iter().filter(|s| s.identity).count())
            }
            Streams::Workload { count, trust_only } => {
                (*count, if *trust_only { 0 } else { *count })
            }
            Streams::Agents { agents } => (agents.len(), agents.len()),
        }
    }
}

/// How a rotation reached the fleet. Latencies are seconds from [`StreamFleet::arm`], sorted.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Reach {
    /// Streams that received a bundle with the new CA.
    pub reached: usize,
    /// Their latencies.
    pub latencies: Vec<f64>,
    /// Streams that ask for an identity.
    pub identity_streams: usize,
    /// Of those, how many received a certificate from the new CA.
    pub identity_reached: usize,
    /// Their latencies.
    pub identity_latencies: Vec<f64>,
    /// Streams that failed.
    pub failed: usize,
    /// Responses the fleet could not use (NACKed).
    pub nacks: u64,
    /// Responses the streams received from [`StreamFleet::arm`] until the report, used or NACKed: one per
    /// stream for the new bundle, one more per identity stream for its certificate, and any the daemon
    /// sent besides.
    pub responses: u64,
    /// The first failure or NACK, for the report.
    pub first_error: Option<String>,
}

/// What every stream reports to.
#[derive(Debug)]
pub(super) struct Progress {
    total: usize,
    /// Streams that ask for an identity.
    identity_streams: usize,
    ready: AtomicUsize,
    reached: AtomicUsize,
    identity_reached: AtomicUsize,
    failed: AtomicUsize,
    nacks: AtomicU64,
    /// Responses received once armed.
    responses: AtomicU64,
    first_error: Mutex<Option<String>>,
    armed: OnceLock<Instant>,
    baseline: OnceLock<Baseline>,
    /// Nanoseconds from arming until the stream saw the new CA in its bundle, plus one; 0: not yet.
    bundle_nanos: Box<[AtomicU64]>,
    /// The same for its identity (streams that ask for one).
    identity_nanos: Box<[AtomicU64]>,
    wake: Notify,
    bundles: Bundles,
}

impl Progress {
    /// Counts a response the stream received, if the rotation clock runs.
    fn received(&self) {
        if self.armed.get().is_some() {
            self.responses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The stream holds everything it asked for (reported once per stream).
    pub(super) fn stream_ready(&self) {
        self.bump(&self.ready, self.total);
    }

    /// The bundles decoded so far.
    pub(super) fn bundles(&self) -> &Bundles {
        &self.bundles
    }

    fn note_error(&self, message: String) {
        let mut first = self
            .first_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert(message);
    }

    /// Counts one more stream in `counter`, and wakes the waiter when that may end its wait: when the
    /// count reaches `target` (with the failures, which always wake it). Waking it on every stream cost
    /// the client a futex call per stream, a tenth of its CPU during a 100,000-stream rotation.
    fn bump(&self, counter: &AtomicUsize, target: usize) {
        let count = counter.fetch_add(1, Ordering::Relaxed) + 1;
        if count + self.failed.load(Ordering::Relaxed) >= target {
            self.wake.notify_one();
        }
    }

    fn fail(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Stores when a stream was reached; false when it already was.
    fn record(&self, slot: &AtomicU64, since: Instant) -> bool {
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        slot.compare_exchange(0, nanos, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Waits until `done` holds, re-checking after every report; false on timeout.
    async fn wait(&self, timeout: Duration, done: impl Fn(&Progress) -> bool) -> bool {
        let waiting = async {
            // A report between the check and the wait leaves a permit, so none is missed.
            while !done(self) {
                self.wake.notified().await;
            }
        };
        tokio::time::timeout(timeout, waiting).await.is_ok()
    }
}

/// The bundles the streams received, decoded once each: every stream of a mesh receives the same
/// bundle, and decoding it for each of 100,000 streams was a fifth of the client's CPU.
#[derive(Debug, Default)]
pub(super) struct Bundles {
    /// The last few distinct bundles (their bytes as received) and their certificates.
    seen: Mutex<VecDeque<(Vec<u8>, Cas)>>,
}

/// A bundle's certificates, shared by every stream that received it.
pub(super) type Cas = Arc<[CertificateDer<'static>]>;

impl Bundles {
    /// How many distinct bundles are kept: a rotation shows two or three.
    const KEPT: usize = 8;

    /// The certificates of the SDS bundle made of `pems`; an error if a PEM does not decode.
    fn decode(&self, pems: Vec<String>) -> anyhow::Result<Cas> {
        self.cached(pems.join("\n").into_bytes(), |text| {
            CertificateDer::pem_slice_iter(text)
                .map(|cert| cert.map_err(|e| anyhow!("a bundle PEM does not decode: {e}")))
                .collect()
        })
    }

    /// The certificates of the bundle received as `bytes`, decoded by `decode` unless a bundle of the
    /// same bytes was decoded before.
    pub(super) fn cached(
        &self,
        bytes: Vec<u8>,
        decode: impl FnOnce(&[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>>,
    ) -> anyhow::Result<Cas> {
        let lock = || self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, cas)) = lock().iter().find(|(seen, _)| *seen == bytes) {
            return Ok(cas.clone());
        }
        let cas: Cas = decode(&bytes)?.into();
        let mut seen = lock();
        if seen.len() == Self::KEPT {
            seen.pop_front();
        }
        seen.push_back((bytes, cas.clone()));
        Ok(cas)
    }
}

/// The CAs of the steady state, as the first stream to hold a bundle saw them.
#[derive(Debug)]
struct Baseline {
    cas: Vec<CertificateDer<'static>>,
    /// Their subjects (DER), to tell which CA issued a certificate.
    subjects: Vec<Vec<u8>>,
}

impl Baseline {
    fn new(cas: Vec<CertificateDer<'static>>) -> Baseline {
        let subjects = cas
            .iter()
            .filter_map(|ca| X509Certificate::from_der(ca).ok())
            .map(|(_, cert)| cert.subject().as_raw().to_vec())
            .collect();
        Baseline { cas, subjects }
    }
}

/// The streams, running.
#[derive(Debug)]
pub struct StreamFleet {
    progress: Arc<Progress>,
    identity_streams: usize,
    tasks: JoinSet<()>,
}

impl StreamFleet {
    /// Connects `plan.connections` HTTP/2 connections and opens every stream over them.
    pub async fn open(plan: FleetPlan) -> anyhow::Result<StreamFleet> {
        if plan.connections == 0 {
            return Err(anyhow!("a fleet needs at least one connection"));
        }
        let mut tasks = JoinSet::new();
        let mut connections = Vec::with_capacity(plan.connections);
        for _ in 0..plan.connections {
            connections.push(connect(&plan.target, &mut tasks).await?);
        }
        let (total, identity_streams) = plan.streams.counts();
        let slots = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        let progress = Arc::new(Progress {
            total,
            identity_streams,
            ready: AtomicUsize::new(0),
            reached: AtomicUsize::new(0),
            identity_reached: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            nacks: AtomicU64::new(0),
            responses: AtomicU64::new(0),
            first_error: Mutex::new(None),
            armed: OnceLock::new(),
            baseline: OnceLock::new(),
            bundle_nanos: slots(total),
            identity_nanos: slots(total),
            wake: Notify::new(),
            bundles: Bundles::default(),
        });
        let spawn = |tasks: &mut JoinSet<()>,
                     index: usize,
                     stream: BoxFuture<'static, anyhow::Result<()>>| {
            let progress = progress.clone();
            tasks.spawn(async move {
                if let Err(error) = stream.await {
                    progress.note_error(format!("stream {index}: {error:#}"));
                    progress.fail();
                }
            });
        };
        let connection = |index: usize| connections[index % connections.len()].clone();
        match plan.streams {
            Streams::Sds {
                node_extensions,
                streams,
            } => {
                let opening = Arc::new(Semaphore::new(SDS_OPENING_AT_ONCE));
                for (index, stream) in streams.into_iter().enumerate() {
                    let (connection, progress) = (connection(index), progress.clone());
                    let opening = opening.clone();
                    let run = async move {
                        let opening = opening
                            .acquire_owned()
                            .await
                            .context("the fleet's opening slots closed")?;
                        run_stream(
                            index,
                            connection,
                            stream,
                            node_extensions,
                            opening,
                            &progress,
                        )
                        .await
                    };
                    spawn(&mut tasks, index, run.boxed());
                }
            }
            Streams::Workload { count, .. } => {
                for index in 0..count {
                    let (connection, progress) = (connection(index), progress.clone());
                    let run =
                        async move { workload_stream::run(index, connection, &progress).await };
                    spawn(&mut tasks, index, run.boxed());
                }
            }
            Streams::Agents { agents } => {
                for (index, agent) in agents.into_iter().enumerate() {
                    let (connection, progress) = (connection(index), progress.clone());
                    let run =
                        async move { agent_stream::run(index, connection, agent, &progress).await };
                    spawn(&mut tasks, index, run.boxed());
                }
            }
        }
        Ok(StreamFleet {
            progress,
            identity_streams,
            tasks,
        })
    }

    /// Waits until every stream holds its secrets; an error names how many did not, and why.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let p = &self.progress;
        let settled = |p: &Progress| {
            p.ready.load(Ordering::Relaxed) + p.failed.load(Ordering::Relaxed) >= p.total
        };
        let in_time = p.wait(timeout, settled).await;
        let (ready, failed) = (
            p.ready.load(Ordering::Relaxed),
            p.failed.load(Ordering::Relaxed),
        );
        if ready == p.total {
            return Ok(());
        }
        let why = p
            .first_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "no error reported".into());
        Err(anyhow!(
            "{ready} of {} streams hold their secrets, {failed} failed{}; first error: {why}",
            p.total,
            if in_time {
                String::new()
            } else {
                format!(", after {timeout:?}")
            },
        ))
    }

    /// Starts the rotation clock: from now on, streams time the first bundle with a new CA.
    pub fn arm(&self) {
        let _ = self.progress.armed.set(Instant::now());
    }

    /// Waits until every stream received the new CA (and every identity stream a certificate from it),
    /// or `timeout`; then reports.
    pub async fn wait_reached(&self, timeout: Duration) -> Reach {
        let identity_streams = self.identity_streams;
        let deadline = Instant::now() + timeout;
        let p = &self.progress;
        let bundles_done = |p: &Progress| {
            p.reached.load(Ordering::Relaxed) + p.failed.load(Ordering::Relaxed) >= p.total
        };
        let identities_done = |p: &Progress| {
            p.identity_reached.load(Ordering::Relaxed) >= identity_streams
                || p.failed.load(Ordering::Relaxed) > 0
        };
        p.wait(timeout, bundles_done).await;
        let left = deadline.saturating_duration_since(Instant::now());
        p.wait(left, identities_done).await;
        let seconds = |slots: &[AtomicU64]| {
            let mut out: Vec<f64> = slots
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .filter(|&n| n > 0)
                .map(|n| (n - 1) as f64 / 1e9)
                .collect();
            out.sort_by(f64::total_cmp);
            out
        };
        let latencies = seconds(&p.bundle_nanos);
        let identity_latencies = seconds(&p.identity_nanos);
        Reach {
            reached: latencies.len(),
            latencies,
            identity_streams,
            identity_reached: identity_latencies.len(),
            identity_latencies,
            failed: p.failed.load(Ordering::Relaxed),
            nacks: p.nacks.load(Ordering::Relaxed),
            responses: p.responses.load(Ordering::Relaxed),
            first_error: p
                .first_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// Closes every stream.
    pub async fn stop(mut self) {
        self.tasks.shutdown().await;
    }
}

/// What one response held, as far as the bench cares.
#[derive(Default)]
pub(super) struct Seen {
    /// The CAs of its bundle, if it holds one.
    pub bundle: Option<Cas>,
    /// The issuer (DER) of the identity's leaf certificate.
    pub leaf_issuer: Option<Vec<u8>>,
}

fn inspect(response: &DiscoveryResponse, bundles: &Bundles) -> anyhow::Result<Seen> {
    let mut seen = Seen::default();
    for secret in decode_secrets(response)? {
        match (secret.name.as_str(), describe(&secret).kind) {
            (
                TRUST,
                SecretKindView::ValidationContext {
                    spiffe_trust_domains,
                    trusted_ca_pem,
                    ..
                },
            ) => {
                let pems: Vec<String> = spiffe_trust_domains
                    .into_iter()
                    .flat_map(|domains| domains.into_values())
                    .chain(trusted_ca_pem)
                    .collect();
                seen.bundle = Some(bundles.decode(pems)?);
            }
            (
                IDENTITY,
                SecretKindView::TlsCertificate {
                    certificate_chain_pem,
                    ..
                },
            ) => {
                let leaf = CertificateDer::pem_slice_iter(certificate_chain_pem.as_bytes())
                    .next()
                    .ok_or_else(|| anyhow!("the identity holds no certificate"))?
                    .map_err(|e| anyhow!("the identity PEM does not decode: {e}"))?;
                seen.leaf_issuer = Some(issuer_of(&leaf)?);
            }
            (name, kind) => return Err(anyhow!("unexpected secret {name:?}: {kind:?}")),
        }
    }
    Ok(seen)
}

/// The issuer (DER) of the first certificate of `der` (one or more DER certificates); only the issuer
/// is read, the extensions are left unparsed.
pub(super) fn issuer_of(der: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (_, cert) = X509CertificateParser::new()
        .with_deep_parse_extensions(false)
        .parse(der)
        .map_err(|e| anyhow!("the identity certificate does not parse: {e}"))?;
    Ok(cert.issuer().as_raw().to_vec())
}

/// The longest response a stream accepts: a bundle of many CAs, far below it.
const MAX_RESPONSE: usize = 4 << 20;

/// The receive window of each connection, over all its streams.
const CONNECTION_WINDOW: u32 = 5 << 20;

/// The path of `StreamSecrets`.
const STREAM_SECRETS: &str =
    "http://localhost/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";

/// Opens one HTTP/2 connection to `target` (`unix:///path`, the only kind the bench serves on); its
/// driver runs in `tasks`.
pub(super) async fn connect(
    target: &str,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<h2::client::SendRequest<Bytes>> {
    let path = target
        .strip_prefix("unix://")
        .or_else(|| target.strip_prefix("unix:"))
        .ok_or_else(|| anyhow!("the bench client connects to unix sockets only, not {target}"))?;
    let io = tokio::net::UnixStream::connect(path)
        .await
        .with_context(|| format!("cannot connect to {target}"))?;
    // Thousands of streams share a connection, and their responses wait in it while the stream tasks
    // queue for a core: a connection window as large as hyper's default client gives them room, and
    // h2's budget for buffered small frames (half the window) with it.
    let (send, connection) = h2::client::Builder::new()
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake(io)
        .await
        .with_context(|| format!("no HTTP/2 connection with {target}"))?;
    tasks.spawn(async move {
        // Ends when the daemon closes the connection or the fleet stops.
        let _ = connection.await;
    });
    Ok(send)
}

/// `message` framed for gRPC: uncompressed, its length, its bytes.
pub(super) fn grpc_frame(message: &impl Message) -> anyhow::Result<Bytes> {
    let len = message.encoded_len();
    let mut framed = BytesMut::with_capacity(5 + len);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(len).context("a request over 4 GiB")?);
    message.encode(&mut framed)?;
    Ok(framed.freeze())
}

/// gRPC messages cut out of a stream's DATA frames, which may split them or hold several.
#[derive(Default)]
struct Frames {
    /// Received bytes not yet cut; shares the frame's buffer unless a message spans frames.
    pending: Bytes,
}

impl Frames {
    /// Adds the payload of the next DATA frame.
    fn push(&mut self, chunk: Bytes) {
        self.pending = if self.pending.is_empty() {
            chunk
        } else {
            let mut joined = BytesMut::with_capacity(self.pending.len() + chunk.len());
            joined.extend_from_slice(&self.pending);
            joined.extend_from_slice(&chunk);
            joined.freeze()
        };
    }

    /// The next whole message, if one has arrived; an error for a compressed or oversized one.
    fn next_message(&mut self) -> anyhow::Result<Option<Bytes>> {
        let Some(header) = self.pending.get(..5) else {
            return Ok(None);
        };
        if header[0] != 0 {
            bail!("the daemon sent a compressed message");
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_RESPONSE {
            bail!("a response of {len} bytes, over {MAX_RESPONSE}");
        }
        if self.pending.len() < 5 + len {
            return Ok(None);
        }
        let mut message = self.pending.split_to(5 + len);
        Ok(Some(message.split_off(5)))
    }
}

/// The responses of one stream, read from its DATA frames.
pub(super) struct Responses {
    /// The method, for errors.
    method: &'static str,
    body: h2::RecvStream,
    frames: Frames,
}

impl Responses {
    /// The next response of a stream that must not end, counted in `progress`.
    pub(super) async fn message<M: Message + Default>(
        &mut self,
        progress: &Progress,
    ) -> anyhow::Result<M> {
        let method = self.method;
        let message = self
            .next()
            .await?
            .ok_or_else(|| anyhow!("the daemon ended the {method} stream"))?;
        progress.received();
        Ok(message)
    }

    /// The next response; `None` when the daemon ended the stream without an error.
    async fn next<M: Message + Default>(&mut self) -> anyhow::Result<Option<M>> {
        loop {
            if let Some(message) = self.frames.next_message()? {
                return Ok(Some(M::decode(message)?));
            }
            let Some(chunk) = self.body.data().await else {
                return self.ended().await.map(|()| None);
            };
            let chunk = chunk.context("the stream failed")?;
            // The window opens as data arrives: responses are consumed as they come.
            let _ = self.body.flow_control().release_capacity(chunk.len());
            self.frames.push(chunk);
        }
    }

    /// After the last DATA frame: an error unless the trailers say `grpc-status: 0`.
    async fn ended(&mut self) -> anyhow::Result<()> {
        let trailers = self
            .body
            .trailers()
            .await
            .context("the stream failed")?
            .unwrap_or_default();
        grpc_status(&trailers)
    }
}

/// An error naming the gRPC status of `headers` unless it is `0` or absent.
fn grpc_status(headers: &http::HeaderMap) -> anyhow::Result<()> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match text("grpc-status") {
        None | Some("0") => Ok(()),
        Some(code) => bail!(
            "grpc-status {code}: {}",
            text("grpc-message").unwrap_or("(no message)")
        ),
    }
}

/// One gRPC call on a fleet's connection: its first request message, framed.
pub(super) struct GrpcCall<'a> {
    /// The method, for errors.
    pub method: &'static str,
    /// Its URI (`http://localhost/<service>/<method>`).
    pub uri: &'static str,
    /// The header the call needs besides gRPC's own (its credentials, or a marker).
    pub header: (&'static str, &'a str),
    /// The first request message, framed ([`grpc_frame`]).
    pub first: Bytes,
    /// Whether the request ends with it (a server-streaming call).
    pub end_stream: bool,
}

impl GrpcCall<'_> {
    /// Sends the call on `connection` and waits for the response headers: the request side, to send
    /// more messages on (unless ended), and the responses. An error names the method and why the
    /// daemon refused it.
    pub(super) async fn open(
        self,
        connection: h2::client::SendRequest<Bytes>,
    ) -> anyhow::Result<(h2::SendStream<Bytes>, Responses)> {
        let method = self.method;
        let request = http::Request::post(self.uri)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(self.header.0, self.header.1)
            .body(())
            .with_context(|| format!("the {method} request headers"))?;
        let mut connection = connection
            .ready()
            .await
            .context("the HTTP/2 connection failed")?;
        let (response, mut requests) = connection
            .send_request(request, false)
            .with_context(|| format!("{method} refused"))?;
        requests
            .send_data(self.first, self.end_stream)
            .with_context(|| format!("the {method} stream closed"))?;
        let response = response
            .await
            .with_context(|| format!("{method} refused"))?;
        if response.status() != http::StatusCode::OK {
            bail!("{method} refused: HTTP {}", response.status());
        }
        grpc_status(response.headers()).with_context(|| format!("{method} refused"))?;
        let responses = Responses {
            method,
            body: response.into_body(),
            frames: Frames::default(),
        };
        Ok((requests, responses))
    }
}

/// How many SDS streams the fleet has between building their first request and reading their first
/// response. Each stream still sends its first request with its headers, as Envoy does; the fleet only
/// does not build them all at once. Envoy's first request is 61 KB: a fleet that built 100,000 of them
/// up front held them until the daemon had read them, and its process grew to 4.9 GB within 30 s of
/// setup (`VmHWM`; 0.5 GB once idle), on the machine the daemon shares. 100,000 Envoys hold theirs on
/// as many hosts. This many keep the daemon a second or more of first requests ahead.
const SDS_OPENING_AT_ONCE: usize = 4096;

/// Runs one stream until it fails; reports into `progress` as it goes. `opening` is the stream's place
/// among those opening ([`SDS_OPENING_AT_ONCE`]), given back once its first response arrives.
async fn run_stream(
    index: usize,
    connection: h2::client::SendRequest<Bytes>,
    plan: StreamPlan,
    node_extensions: usize,
    opening: tokio::sync::OwnedSemaphorePermit,
    progress: &Progress,
) -> anyhow::Result<()> {
    let names: Vec<String> = if plan.identity {
        vec![IDENTITY.to_owned(), TRUST.to_owned()]
    } else {
        vec![TRUST.to_owned()]
    };
    let first = DiscoveryRequest {
        node: Some(envoy_node(&plan.node_id, node_extensions)),
        resource_names: names.clone(),
        type_url: SECRET_TYPE_URL.to_owned(),
        ..Default::default()
    };
    let authorization = format!("Bearer {}", plan.token.trim());
    let call = GrpcCall {
        method: "StreamSecrets",
        uri: STREAM_SECRETS,
        header: ("authorization", &authorization),
        first: grpc_frame(&first)?,
        end_stream: false,
    };
    drop(first);
    let (mut requests, mut responses) = call.open(connection).await?;

    let (mut has_bundle, mut has_identity, mut ready) = (false, !plan.identity, false);
    let mut opening = Some(opening);
    loop {
        let response: DiscoveryResponse = responses.message(progress).await?;
        // The daemon has read the first request and answered: the next stream may open.
        drop(opening.take());
        let error_detail = match inspect(&response, progress.bundles()) {
            Ok(seen) => {
                note(index, &seen, progress);
                has_bundle |= seen.bundle.is_some();
                has_identity |= seen.leaf_issuer.is_some();
                None
            }
            Err(error) => {
                progress.nacks.fetch_add(1, Ordering::Relaxed);
                progress.note_error(format!("stream {index} NACKs: {error:#}"));
                Some(RpcStatus {
                    code: tonic::Code::InvalidArgument as i32,
                    message: format!("{error:#}"),
                    details: Vec::new(),
                })
            }
        };
        let ack = DiscoveryRequest {
            version_info: response.version_info,
            resource_names: names.clone(),
            type_url: SECRET_TYPE_URL.to_owned(),
            response_nonce: response.nonce,
            error_detail,
            ..Default::default()
        };
        requests
            .send_data(grpc_frame(&ack)?, false)
            .context("the SDS stream closed")?;
        if !ready && has_bundle && has_identity {
            ready = true;
            progress.stream_ready();
        }
    }
}

/// A node like the one Envoy sends in a stream's first request, listing `extensions` extensions: Envoy
/// 1.40 lists every extension it was built with, and its first SDS request measured 61 KB, the size of
/// this node with 420. The daemon must not keep that much per stream after reading it.
fn envoy_node(id: &str, extensions: usize) -> Node {
    let extensions = (0..extensions)
        .map(|i| Extension {
            name: format!("envoy.filters.http.simulated_extension_{i:04}"),
            category: "envoy.filters.http".to_owned(),
            type_urls: vec![format!(
                "envoy.extensions.filters.http.simulated_extension_{i:04}.v3.SimulatedExtension"
            )],
            ..Default::default()
        })
        .collect();
    Node {
        id: id.to_owned(),
        user_agent_name: "envoy".to_owned(),
        extensions,
        ..Default::default()
    }
}

/// Records what a response brought: the baseline, and (once armed) the new CA reaching the stream.
pub(super) fn note(index: usize, seen: &Seen, progress: &Progress) {
    let Some(armed) = progress.armed.get() else {
        if let Some(cas) = &seen.bundle {
            progress
                .baseline
                .get_or_init(|| Baseline::new(cas.to_vec()));
        }
        return;
    };
    let Some(baseline) = progress.baseline.get() else {
        return;
    };
    if let Some(cas) = &seen.bundle {
        if cas.iter().any(|ca| !baseline.cas.contains(ca))
            && progress.record(&progress.bundle_nanos[index], *armed)
        {
            progress.bump(&progress.reached, progress.total);
        }
    }
    if let Some(issuer) = &seen.leaf_issuer {
        if !baseline.subjects.contains(issuer)
            && progress.record(&progress.identity_nanos[index], *armed)
        {
            progress.bump(&progress.identity_reached, progress.identity_streams);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `message` with its gRPC header.
    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    proptest! {
        /// However the DATA frames cut the stream, the messages come out whole and in order.
        #[test]
        fn messages_come_out_whole_however_the_frames_cut_them(
            messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
            cuts in proptest::collection::vec(0usize..2000, 0..8),
        ) {
            let wire: Vec<u8> = messages.iter().flat_map(|m| framed(m)).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.push(wire.len());
            cuts.sort_unstable();
            let mut frames = Frames::default();
            let (mut out, mut from) = (Vec::new(), 0);
            for cut in cuts {
                frames.push(Bytes::copy_from_slice(&wire[from..cut]));
                from = cut;
                while let Some(message) = frames.next_message().expect("well formed") {
                    out.push(message.to_vec());
                }
            }
            prop_assert_eq!(out, messages);
            prop_assert!(frames.pending.is_empty());
        }
    }

    #[test]
    fn a_compressed_or_oversized_message_is_an_error_and_a_short_one_waits() {
        let mut frames = Frames::default();
        frames.push(Bytes::from_static(&[0, 0, 0]));
        assert!(frames.next_message().expect("no error yet").is_none());
        frames.push(Bytes::from_static(&[0, 2, b'h']));
        assert!(frames.next_message().expect("no error yet").is_none());
        frames.push(Bytes::from_static(b"i"));
        assert_eq!(
            frames.next_message().expect("whole").as_deref(),
            Some(&b"hi"[..])
        );

        let mut compressed = Frames::default();
        compressed.push(Bytes::from_static(&[1, 0, 0, 0, 0]));
        let e = compressed.next_message().expect_err("compressed");
        assert!(e.to_string().contains("compressed"), "{e}");

        let mut huge = Frames::default();
        let len = (MAX_RESPONSE as u32 + 1).to_be_bytes();
        huge.push(Bytes::copy_from_slice(&[0, len[0], len[1], len[2], len[3]]));
        let e = huge.next_message().expect_err("oversized");
        assert!(e.to_string().contains("over"), "{e}");
    }

    #[test]
    fn a_non_zero_grpc_status_is_an_error_naming_it() {
        let mut headers = http::HeaderMap::new();
        assert!(grpc_status(&headers).is_ok(), "absent");
        headers.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert!(grpc_status(&headers).is_ok());
        headers.insert("grpc-status", http::HeaderValue::from_static("16"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static("token expired"),
        );
        let e = grpc_status(&headers).expect_err("16");
        assert_eq!(e.to_string(), "grpc-status 16: token expired");
    }

    #[test]
    fn a_bundle_is_decoded_once_and_a_bad_one_is_refused_every_time() {
        let pem = rcgen::generate_simple_self_signed(vec!["ca.example".to_owned()])
            .expect("a self-signed certificate")
            .cert
            .pem();
        let bundles = Bundles::default();
        let first = bundles.decode(vec![pem.clone()]).expect("decodes");
        assert_eq!(first.len(), 1);
        let again = bundles.decode(vec![pem.clone()]).expect("decodes");
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second decode is the kept one"
        );
        let bad = pem.replace("MII", "!!!");
        for _ in 0..2 {
            assert!(bundles.decode(vec![bad.clone()]).is_err());
        }
        let two = bundles.decode(vec![pem.clone(), pem]).expect("decodes");
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn the_simulated_node_is_the_size_of_envoys() {
        let size = envoy_node("default.web-1", 420).encoded_len();
        assert!((55_000..70_000).contains(&size), "{size} bytes");
    }
}
