//! The one stream driver behind `StreamSecrets` and `DeltaSecrets`.
//!
//! The driver owns everything the two protocols share: authentication of the first request, the
//! session, waiting for the proxy's identity, nonces, the ACK/NACK bookkeeping and its events, metrics,
//! and following snapshots. A [`Protocol`] only says how its requests subscribe and how its responses
//! carry resources.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::google::rpc::Status as RpcStatus;
use futures::future::Either;
use meshca_control::{ProxyEntry, ResourceName, TrustView};
use meshca_serve::ledger::Ledger;
use meshca_serve::{bounded, shown, ConnProgress, StreamMetrics};
use tonic::Status;

use crate::authn::{self, Principal};
use crate::names::{self, Lookup, Resolved};
use crate::registry::StreamKind;
use crate::secret::{self, KeylessIdentity};
use crate::session::{self, Session, Usable};
use crate::shared::Shared;
use crate::transport::grpc::Requests;
use crate::transport::outbox::Outbox;
use crate::transport::wire::Node;

/// The reply part of a request: which response it answers and how.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The nonce of the response it answers; empty on a request that answers none.
    pub nonce: String,
    /// The proxy's error message: a NACK.
    pub error: Option<String>,
    /// The version it says it holds, for protocols that ACK by version (state of the world); `None`
    /// where the nonce alone ACKs (delta).
    pub version: Option<String>,
}

/// What the driver reads from a request before the protocol applies it.
pub(crate) struct Header<'a> {
    pub node: Option<&'a Node>,
    pub type_url: &'a str,
    pub reply: Reply,
}

impl<'a> Header<'a> {
    /// A header from a request's fields; `version` as [`Reply::version`].
    pub(crate) fn new(
        node: Option<&'a Node>,
        type_url: &'a str,
        nonce: &str,
        error: Option<&RpcStatus>,
        version: Option<&str>,
    ) -> Self {
        Header {
            node,
            type_url,
            reply: Reply {
                nonce: nonce.to_owned(),
                error: error.map(|e| e.message.clone()),
                version: version.map(str::to_owned),
            },
        }
    }
}

/// The current content, as a protocol building a response sees it.
pub(crate) struct Current<'a> {
    resolve: &'a mut dyn FnMut(&ResourceName) -> Option<Resolved>,
    /// The version of the last response sent.
    pub last_version: Option<&'a str>,
    /// Send even when the proxy holds the content already (a fresh request asks for it).
    pub force: bool,
}

impl Current<'_> {
    /// The secret `name` means now, or `None` when it has no content now (unknown names are logged).
    pub(crate) fn resolve(&mut self, name: &ResourceName) -> Option<Resolved> {
        (self.resolve)(name)
    }
}

/// What a protocol wants sent, or why nothing is.
pub(crate) enum Build<R> {
    /// Send `response` (its nonce is set by the driver).
    Send {
        response: R,
        /// The response's version.
        version: String,
        /// The resources it carries or removes, for logs.
        resources: Vec<String>,
    },
    /// The proxy already holds the current content.
    Unchanged,
    /// There is nothing to send yet (no subscribed resource is available); the proxy keeps what it has.
    Withheld,
    /// A secret cannot be sent: the stream is refused.
    Refused(KeylessIdentity),
}

/// What differs between the state-of-the-world and the delta protocol.
pub(crate) trait Protocol: Default + Send + Sync + 'static {
    type Request: crate::transport::wire::Request + Send + 'static;
    type Response: Send + 'static;
    const KIND: StreamKind;
    /// A request whose nonce is stale is ignored whole (state of the world), or only its reply part
    /// (delta, whose subscription changes apply whatever the nonce).
    const STALE_IGNORES_SUBSCRIPTION: bool;

    fn header(request: &Self::Request) -> Header<'_>;

    /// Takes the node out of a request.
    fn take_node(request: &mut Self::Request) -> Option<Node>;

    /// Every resource name a request carries, to be checked against the limits before it applies.
    fn requested_names(request: &Self::Request) -> impl Iterator<Item = &str>;

    /// Applies the subscription part of a request; returns the whole new subscription when it changed.
    fn subscribe(&mut self, request: Self::Request, first: bool) -> Option<Vec<ResourceName>>;

    /// Whether a request makes the stream respond, and whether the response must be sent even when the
    /// proxy holds its content already (`Some(force)`).
    fn responds(first: bool, fresh: bool, changed: bool) -> Option<bool>;

    /// The response that brings the proxy to the current content.
    fn build(&mut self, current: &mut Current<'_>) -> Build<Self::Response>;

    fn set_nonce(response: &mut Self::Response, nonce: String);
}

type Outbound<R> = Outbox<Result<R, Status>>;

/// What a stream starts from. It comes boxed, so that the stream's state keeps no room for it once the
/// stream is open.
pub(crate) struct Start<R> {
    pub shared: Arc<Shared>,
    pub principal: Principal,
    pub inbound: Requests<R>,
    /// What the stream's connection receives, while the first request is awaited.
    pub progress: Option<ConnProgress>,
}

/// Drives one stream until the proxy leaves or an error ends it (sent as the stream's status).
pub(crate) async fn run<P: Protocol>(start: Box<Start<P::Request>>, outbox: Outbound<P::Response>)
where
    P::Request: prost::Message + Default,
{
    if let Err(status) = serve::<P>(start, &outbox).await {
        outbox.send(Err(status)).await;
    }
}

/// What wakes an open stream.
enum Next<R> {
    Snapshot(Usable),
    Request(R),
}

async fn serve<P: Protocol>(
    start: Box<Start<P::Request>>,
    outbox: &Outbound<P::Response>,
) -> Result<(), Status>
where
    P::Request: prost::Message + Default,
{
    // Taken out of its box by a function of its own: moved out here (`*start`), the box would stay
    // allocated for as long as the stream runs.
    let Start {
        shared,
        principal,
        mut inbound,
        progress,
    } = unboxed(start);
    // Opening and handling are boxed: their state is allocated only while they run, so an idle
    // stream holds only what this loop waits with.
    let opened = open::<P>(shared, principal, &mut inbound, progress, outbox);
    let Some(mut stream) = Box::pin(opened).await? else {
        return Ok(());
    };
    loop {
        // What comes next is read in a block of its own and moved into its handling's (boxed)
        // future: kept in this loop across the handling's await, the request (224 bytes) would widen
        // the state every idle stream keeps by its size.
        let handling = {
            let next = tokio::select! {
                snapshot = stream.session.next_change() => Next::Snapshot(snapshot?),
                received = inbound.message() => match received {
                    Ok(Some(request)) => Next::Request(request),
                    Ok(None) => return Ok(()),
                    Err(status) => {
                        tracing::debug!(proxy = %stream.session.key(), %status, "stream ended");
                        return Err(status);
                    }
                },
            };
            match next {
                Next::Snapshot(snapshot) => Either::Left(Box::pin(stream.on_snapshot(snapshot))),
                Next::Request(request) => {
                    Either::Right(Box::pin(stream.on_request(request, false)))
                }
            }
        };
        handling.await?;
    }
}

/// The value in `boxed`, whose allocation is freed on return.
#[expect(
    clippy::boxed_local,
    reason = "taking the box is the point: it is freed here, not where the value lives on"
)]
fn unboxed<T>(boxed: Box<T>) -> T {
    *boxed
}

/// Reads the first request, authenticates it, waits for the proxy's identity and answers; `None` when
/// the proxy closed the stream before asking anything.
async fn open<'o, P: Protocol>(
    shared: Arc<Shared>,
    principal: Principal,
    inbound: &mut Requests<P::Request>,
    progress: Option<ConnProgress>,
    outbox: &'o Outbound<P::Response>,
) -> Result<Option<Driver<'o, P>>, Status>
where
    P::Request: prost::Message + Default,
{
    let Some(mut first) =
        session::first_request(&shared, inbound.message(), progress.as_ref()).await?
    else {
        return Ok(None);
    };
    // The node is read here and not kept: Envoy's lists every extension it was built with (about
    // 60 KB), and the request waits below for as long as the proxy's identity takes.
    let node = P::take_node(&mut first);
    // An attested caller names itself by its process, not its node id.
    if principal.attested.is_none() {
        authn::check_first_node(node.as_ref(), &authn::proxy_key(&principal.claims))
            .map_err(|status| shared.auth_failure(status))?;
    }
    let ctx = authn::proxy_context(&principal.claims, node.as_ref());
    drop(node);
    let mut session = Session::open(shared, principal, ctx, Some(P::KIND)).await?;
    let usable = session.wait_for_identity().await?;
    let mut stream = Driver::<P>::new(session, outbox, usable);
    stream.on_request(first, true).await?;
    Ok(Some(stream))
}

/// The last response sent on a stream.
struct Sent {
    nonce: String,
    version: String,
    /// The resources it carried or removed.
    resources: Vec<String>,
    /// Its version in the stream's ledger.
    ledger_version: u64,
    /// When it was sent, for the ACK-lag metric.
    sent_at: Instant,
}

struct Driver<'o, P: Protocol> {
    protocol: P,
    session: Session,
    outbox: &'o Outbound<P::Response>,
    /// The trust of the snapshot the stream last answered from (not the snapshot: see [`TrustView`]).
    snapshot: TrustView,
    /// The proxy's entry in that snapshot.
    entry: ProxyEntry,
    last_sent: Option<Sent>,
    /// What the proxy was sent and has acknowledged, for the owner.
    ledger: Ledger,
    nonce_seq: u64,
    logged_unknown: HashSet<String>,
}

impl<'o, P: Protocol> Driver<'o, P> {
    fn new(session: Session, outbox: &'o Outbound<P::Response>, usable: Usable) -> Self {
        Self {
            protocol: P::default(),
            session,
            outbox,
            snapshot: usable.trust,
            entry: usable.entry,
            last_sent: None,
            ledger: Ledger::default(),
            nonce_seq: 0,
            logged_unknown: HashSet::new(),
        }
    }

    async fn on_request(&mut self, request: P::Request, first: bool) -> Result<(), Status> {
        let Header {
            node,
            type_url,
            reply,
        } = P::header(&request);
        if !first && !self.session.is_attested() {
            authn::check_later_node(node, self.session.key())
                .map_err(|status| self.session.shared.auth_failure(status))?;
        }
        secret::check_type_url(type_url)?;
        self.check_names(P::requested_names(&request))?;
        let fresh = reply.nonce.is_empty();
        if !fresh {
            let current = self
                .last_sent
                .as_ref()
                .is_some_and(|sent| sent.nonce == reply.nonce);
            if current {
                self.on_reply(reply).await;
            } else {
                tracing::debug!(proxy = %self.session.key(), nonce = %reply.nonce, "ignoring the reply of a request with a stale nonce");
                if P::STALE_IGNORES_SUBSCRIPTION {
                    return Ok(());
                }
            }
        }
        let changed = match self.protocol.subscribe(request, first) {
            Some(resources) => {
                self.check_subscription(resources.len())?;
                let listed: Vec<String> = resources.iter().map(|r| r.to_string()).collect();
                self.session
                    .subscribe(listed)
                    .map_err(|status| self.over_limit(status))?;
                self.session.subscribed(resources).await;
                true
            }
            None => false,
        };
        if let Some(force) = P::responds(first, fresh, changed) {
            self.respond(force).await?;
        }
        Ok(())
    }

    /// Refuses a request with a name longer than the limit or more names than a stream may hold,
    /// before any of it is kept.
    fn check_names<'r>(&self, names: impl Iterator<Item = &'r str>) -> Result<(), Status> {
        self.session
            .shared
            .check_names(names)
            .map_err(|status| self.over_limit(status))
    }

    fn check_subscription(&self, names: usize) -> Result<(), Status> {
        self.session
            .shared
            .check_name_count(names)
            .map_err(|status| self.over_limit(status))
    }

    /// Logs, within the proxy's budget, why the stream is closed.
    fn over_limit(&self, status: Status) -> Status {
        if let Some(suppressed) = self.session.may_warn() {
            tracing::warn!(
                proxy = %self.session.key(),
                message = status.message(),
                suppressed,
                "SDS stream closed: over a limit"
            );
        }
        status
    }

    /// Handles the ACK or NACK of the last response.
    async fn on_reply(&mut self, reply: Reply) {
        let Some(sent) = &self.last_sent else { return };
        let metrics = self.session.shared.metrics();
        if let Some(message) = reply.error {
            StreamMetrics::incr(&metrics.nacks);
            // Logged, kept for the admin API and told the owner bounded, whatever the proxy sent.
            let message = bounded(&message);
            if let Some(suppressed) = self.session.may_warn() {
                tracing::warn!(
                    proxy = %self.session.key(),
                    resources = ?sent.resources,
                    version = %sent.version,
                    %message,
                    suppressed,
                    "proxy rejected secrets (NACK); it keeps its previous ones"
                );
            }
            let last = message.clone();
            self.session.update_info(|info| {
                info.nacks += 1;
                info.last_nack = Some(last);
            });
            if let Some(generation) = self.ledger.reject(sent.ledger_version) {
                self.session
                    .stream
                    .rejected(generation, sent.version.clone(), message)
                    .await;
            }
        } else if reply.version.as_ref().is_none_or(|v| *v == sent.version) {
            StreamMetrics::incr(&metrics.acks);
            metrics.ack_lag.observe(sent.sent_at.elapsed());
            // Only the last response can be ACKed (a reply to an older nonce is ignored), so the ledger
            // knows it; a second ACK of it tells nothing new.
            if let Ok(Some(acked)) = self.ledger.ack(sent.ledger_version) {
                self.record_ack(acked.generation).await;
            }
        } else {
            tracing::debug!(
                proxy = %self.session.key(),
                version = ?reply.version,
                "reply to the last nonce with an unexpected version; not an ACK"
            );
        }
    }

    /// Reports that the proxy holds the last response, which stands for snapshot `generation`.
    async fn record_ack(&self, generation: u64) {
        let Some(sent) = &self.last_sent else { return };
        let version = sent.version.clone();
        self.session.update_info(|info| {
            info.last_acked_version = Some(version);
            info.acked_generation = Some(generation);
        });
        self.session
            .stream
            .acknowledged(generation, sent.version.clone())
            .await;
    }

    async fn on_snapshot(&mut self, usable: Usable) -> Result<(), Status> {
        self.snapshot = usable.trust;
        self.entry = usable.entry;
        self.respond(false).await
    }

    /// Sends what the proxy lacks (everything, when `force`d). When it lacks nothing, the last response
    /// is deemed to be of the current generation, and ACKed again if it was ACKed.
    async fn respond(&mut self, force: bool) -> Result<(), Status> {
        let built = {
            let (snapshot, entry) = (&self.snapshot, &self.entry);
            let (session, logged_unknown) = (&self.session, &mut self.logged_unknown);
            let most_names = session.shared.limits().names_per_stream;
            let mut resolve = |name: &ResourceName| match names::resolve(
                snapshot,
                Some(entry),
                &session.ctx,
                name,
            ) {
                Lookup::Found(resolved) => Some(resolved),
                Lookup::Unavailable(why) => {
                    tracing::debug!(proxy = %session.key(), resource = %shown(name.as_str()), %why, "resource not available");
                    None
                }
                Lookup::Unknown => {
                    // Once per name and stream (as many names as a stream may hold), within the
                    // proxy's warning budget.
                    let first = logged_unknown.len() < most_names
                        && logged_unknown.insert(name.to_string());
                    if first {
                        if let Some(suppressed) = session.may_warn() {
                            tracing::warn!(
                                proxy = %session.key(),
                                resource = %shown(name.as_str()),
                                suppressed,
                                "proxy asked for an unknown secret name; it is not served"
                            );
                        }
                    }
                    None
                }
            };
            let mut current = Current {
                resolve: &mut resolve,
                last_version: self.last_sent.as_ref().map(|s| s.version.as_str()),
                force,
            };
            self.protocol.build(&mut current)
        };
        match built {
            Build::Send {
                response,
                version,
                resources,
            } => self.send(response, version, resources).await,
            Build::Unchanged => {
                // The last response stands for this generation too; ACKed again if it was ACKed.
                if let Some(acked) = self.ledger.unchanged(self.snapshot.generation) {
                    self.record_ack(acked.generation).await;
                }
                Ok(())
            }
            Build::Withheld => Ok(()),
            Build::Refused(keyless) => {
                Err(self
                    .session
                    .shared
                    .auth_failure(Status::permission_denied(format!(
                        "proxy {} is refused: {keyless}",
                        self.session.key()
                    ))))
            }
        }
    }

    async fn send(
        &mut self,
        mut response: P::Response,
        version: String,
        resources: Vec<String>,
    ) -> Result<(), Status> {
        // A request handled in the same instant as the expiry must not get secrets either.
        self.session.check_expiry()?;
        self.nonce_seq += 1;
        let nonce = format!("{}-{}", self.session.id(), self.nonce_seq);
        P::set_nonce(&mut response, nonce.clone());
        self.outbox.send(Ok(response)).await;
        StreamMetrics::incr(&self.session.shared.metrics().responses_pushed);
        tracing::debug!(proxy = %self.session.key(), %version, ?resources, "pushed secrets");
        let sent_version = version.clone();
        self.session
            .update_info(|info| info.last_sent_version = sent_version);
        self.last_sent = Some(Sent {
            nonce,
            version,
            resources,
            ledger_version: self
                .ledger
                .send(self.snapshot.generation, vec![self.session.id()]),
            sent_at: Instant::now(),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
