//! The stream hub: what every protocol on meshca's listeners shares, and the one way a stream speaks to
//! the owner.
//!
//! The owner publishes snapshots and revocation lists; a stream of any protocol (SDS, the Workload API,
//! the agent protocol) reads them here, waits here for the snapshots that concern its proxy, and reports
//! its life to the owner through a [`HubStream`]: connected (before its identity is ready: the owner
//! issues identities to connected proxies only), subscribed, acknowledged or rejected a generation,
//! disconnected (when the handle drops). The rollout gate counts these reports, so the rule they follow
//! is written once, here; when a stream acknowledges is its protocol's ACK policy (see
//! [`crate::ledger`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_auth::{Claims, RevocationList, Verifier, CLOCK_SKEW_LEEWAY_SECS};
use meshca_control::{ProxyKey, ResourceName, Snapshot, StreamEvent, StreamId};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::bearer;
use crate::log_budget::LogBudget;
use crate::metrics::StreamMetrics;
use crate::options::{HubOptions, StreamLimits};
use crate::wake::{Waiter, Wakes};

/// A good capacity for the event channel handed to [`Hub::new`]: enough for a burst of connections and
/// ACKs while the owner reconciles; when it is full, streams wait to report.
pub const EVENT_BUFFER: usize = 4096;

/// The hub. Cheap to clone; every clone is the same hub.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    verifier: Verifier,
    revocations: watch::Receiver<Arc<RevocationList>>,
    events: mpsc::Sender<StreamEvent>,
    options: HubOptions,
    metrics: Arc<StreamMetrics>,
    shutdown: CancellationToken,
    /// Log lines about refused requests, which anyone who can connect can cause.
    refusals_logged: LogBudget,
    next_id: AtomicU64,
    /// Where streams wait for the snapshots that concern them.
    wakes: Arc<Wakes>,
    /// Starts the task that wakes them, with the first waiter (it needs the runtime).
    dispatcher: std::sync::Once,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// A hub that hands out `snapshots`, verifies tokens with `verifier` against the current
    /// `revocations`, and reports its streams on `events` (bounded: see [`EVENT_BUFFER`]).
    pub fn new(
        snapshots: watch::Receiver<Arc<Snapshot>>,
        verifier: Verifier,
        revocations: watch::Receiver<Arc<RevocationList>>,
        events: mpsc::Sender<StreamEvent>,
        options: HubOptions,
    ) -> Hub {
        Hub {
            inner: Arc::new(Inner {
                snapshots,
                verifier,
                revocations,
                events,
                metrics: Arc::new(StreamMetrics::default()),
                shutdown: CancellationToken::new(),
                refusals_logged: LogBudget::new(options.limits.warnings_per_minute),
                next_id: AtomicU64::new(1),
                wakes: Arc::default(),
                dispatcher: std::sync::Once::new(),
                options,
            }),
        }
    }

    /// The hub's options.
    pub fn options(&self) -> &HubOptions {
        &self.inner.options
    }

    /// The limits every protocol on the hub enforces.
    pub fn limits(&self) -> &StreamLimits {
        &self.inner.options.limits
    }

    /// How long a stream waits for its first request (and for its proxy's identity) before it fails.
    pub fn first_request_wait(&self) -> Duration {
        self.inner.options.identity_wait
    }

    /// The counters of the hub's streams and listeners.
    pub fn metrics(&self) -> &Arc<StreamMetrics> {
        &self.inner.metrics
    }

    /// The snapshots the owner publishes.
    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.inner.snapshots.clone()
    }

    /// The revoked tokens: a stream whose token appears in a new list ends.
    pub fn revocations(&self) -> watch::Receiver<Arc<RevocationList>> {
        self.inner.revocations.clone()
    }

    /// Verifies the `authorization: Bearer <token>` header of a request: a token the hub's key signed,
    /// not expired (with the verifier's clock-skew leeway) and not revoked, of any type (the caller
    /// checks the type). Every failure is `UNAUTHENTICATED`, counted and logged ([`Hub::refused`]).
    pub fn verify_bearer(&self, headers: &http::HeaderMap) -> Result<Claims, Status> {
        let revoked = self.inner.revocations.borrow().clone();
        bearer::verify_bearer(headers, &self.inner.verifier, &revoked, SystemTime::now())
            .map_err(|status| self.refused(status))
    }

    /// Counts a request refused for who it is (authentication or authorization) and logs it within
    /// the hub's budget; returns the status to answer with.
    pub fn refused(&self, status: Status) -> Status {
        StreamMetrics::incr(&self.inner.metrics.auth_failures);
        if let Some(suppressed) = self.inner.refusals_logged.admit() {
            tracing::info!(
                code = ?status.code(),
                message = status.message(),
                suppressed,
                "SDS request refused"
            );
        }
        status
    }

    /// Ends every open stream (so that a graceful HTTP/2 shutdown can complete) and refuses new ones.
    /// [`crate::BoundListeners::serve_service`] calls it when its shutdown token fires.
    pub fn close_streams(&self) {
        self.inner.shutdown.cancel();
    }

    /// Resolves once [`Hub::close_streams`] was called: every stream on the hub ends then.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        self.inner.shutdown.clone().cancelled_owned()
    }

    /// A wait for the snapshots that concern `proxy`. Take it before reading the snapshot: a snapshot
    /// published after that wakes it.
    pub fn snapshot_waiter(&self, proxy: &ProxyKey) -> SnapshotWaiter {
        self.waiter(proxy, false)
    }

    /// A wait for the snapshots that concern `proxy` or change the registration table, for streams that
    /// match callers against it (the Workload API's). Take it before reading the snapshot.
    pub fn registrations_waiter(&self, proxy: &ProxyKey) -> SnapshotWaiter {
        self.waiter(proxy, true)
    }

    fn waiter(&self, proxy: &ProxyKey, registrations: bool) -> SnapshotWaiter {
        let inner = &self.inner;
        inner.dispatcher.call_once(|| {
            // The generation seen now is the dispatcher's start: any later publish wakes someone.
            let mut snapshots = inner.snapshots.clone();
            let last = snapshots.borrow_and_update().generation;
            tokio::spawn(crate::wake::dispatch(
                inner.wakes.clone(),
                snapshots,
                last,
                inner.revocations.clone(),
                inner.shutdown.clone(),
            ));
        });
        SnapshotWaiter(inner.wakes.subscribe(proxy, registrations))
    }

    /// A new stream, not yet known to the owner: its id is reserved, so that the protocol can register
    /// it under that id (and refuse it over a limit) before [`NewStream::connect`] tells the owner.
    pub fn new_stream(&self) -> NewStream {
        NewStream {
            hub: self.clone(),
            id: StreamId(self.inner.next_id.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Tells the owner a stream of the proxy `claims` speak for is open: [`Hub::new_stream`], then
    /// [`NewStream::connect`].
    pub async fn connect(&self, claims: Arc<Claims>) -> HubStream {
        self.new_stream().connect(claims).await
    }

    /// Reports an event to the owner. The channel is bounded: when the owner falls behind, the stream
    /// waits here (backpressure on that proxy) rather than dropping the event, which the owner's view
    /// of streams and ACKs depends on.
    async fn emit(&self, event: StreamEvent) {
        // The owner may have stopped listening during shutdown; nothing to do then.
        let _ = self.inner.events.send(event).await;
    }

    /// [`Hub::emit`] where nothing can wait (a `Drop`): sent at once when there is room, else by a
    /// task that waits for room. Never dropped while the owner listens.
    fn emit_from_drop(&self, event: StreamEvent) {
        match self.inner.events.try_send(event) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                let events = self.inner.events.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = events.send(event).await;
                    });
                }
            }
        }
    }
}

/// One stream's wait for the snapshots that concern its proxy (see [`Hub::snapshot_waiter`]).
#[derive(Debug)]
pub struct SnapshotWaiter(Waiter);

impl SnapshotWaiter {
    /// Resolves when a snapshot may concern the proxy (since the last time this resolved); false once
    /// no snapshot will come any more (the hub is shutting down). Cancel-safe.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await
    }
}

/// A stream whose id is reserved (see [`Hub::new_stream`]); dropped, the owner never hears of it.
#[derive(Debug)]
pub struct NewStream {
    hub: Hub,
    id: StreamId,
}

impl NewStream {
    /// The id the stream will have.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Tells the owner the stream is open for the proxy `claims` speak for (before its identity is
    /// ready: the owner issues identities to connected proxies only), and returns its handle, which
    /// reports the rest of the stream's life and that it ended (when dropped). Waits while the owner's
    /// channel is full.
    pub async fn connect(self, claims: Arc<Claims>) -> HubStream {
        let NewStream { hub, id } = self;
        hub.emit(StreamEvent::Connected { stream: id, claims })
            .await;
        HubStream {
            hub,
            id,
            open: true,
        }
    }
}

/// An open stream, as the owner knows it: made by [`Hub::connect`], it reports what the stream
/// subscribes to and which snapshot generations its peer holds, and that it ended when dropped (or
/// [`HubStream::close`]d). Every protocol's streams report through one of these, never by hand.
#[derive(Debug)]
pub struct HubStream {
    hub: Hub,
    id: StreamId,
    /// Whether `Disconnected` is still to be reported.
    open: bool,
}

impl HubStream {
    /// The stream's id, unique on its hub.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The stream's subscription is now exactly `resources`.
    pub async fn subscribe(&self, resources: Vec<ResourceName>) {
        self.hub
            .emit(StreamEvent::Subscribed {
                stream: self.id,
                resources,
            })
            .await;
    }

    /// The peer holds the content of snapshot `generation`, sent as `version` (from its ACK, or by the
    /// protocol's ACK policy: see [`crate::ledger`]).
    pub async fn acknowledged(&self, generation: u64, version: String) {
        self.hub
            .emit(StreamEvent::Acked {
                stream: self.id,
                generation,
                version,
            })
            .await;
    }

    /// The peer refused the content of snapshot `generation`, sent as `version`, and keeps what it had.
    pub async fn rejected(&self, generation: u64, version: String, message: String) {
        self.hub
            .emit(StreamEvent::Nacked {
                stream: self.id,
                generation,
                version,
                message,
            })
            .await;
    }

    /// The peer holds its own key (a `meshca agent`): `key` is the one to certify next, at once when
    /// `replace_now`.
    pub async fn offer_key(&self, key: Arc<meshca_ca::PublicKey>, replace_now: bool) {
        self.hub
            .emit(StreamEvent::KeyOffered {
                stream: self.id,
                key,
                replace_now,
            })
            .await;
    }

    /// Reports that the stream ended, waiting while the owner's channel is full (dropping the handle
    /// reports it too, without waiting).
    pub async fn close(mut self) {
        self.open = false;
        self.hub
            .emit(StreamEvent::Disconnected { stream: self.id })
            .await;
    }
}

impl Drop for HubStream {
    fn drop(&mut self) {
        if self.open {
            self.hub
                .emit_from_drop(StreamEvent::Disconnected { stream: self.id });
        }
    }
}

/// The moment a token expiring at `expires_at` (Unix seconds) stops being accepted, with the same
/// clock-skew leeway the verifier allows: an open stream of that token ends then.
pub fn token_deadline(expires_at: u64) -> tokio::time::Instant {
    /// Far enough that a token valid longer is treated as never expiring on an open stream.
    const FAR: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
    let deadline = UNIX_EPOCH
        .checked_add(Duration::from_secs(
            expires_at.saturating_add(CLOCK_SKEW_LEEWAY_SECS),
        ))
        .map_or(FAR, |t| {
            t.duration_since(SystemTime::now()).unwrap_or_default()
        });
    tokio::time::Instant::now() + deadline.min(FAR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub_with_events(capacity: usize) -> (Hub, mpsc::Receiver<StreamEvent>) {
        let (signing, _pkcs8) = meshca_auth::SigningKey::generate().expect("a token key");
        let (_snapshots, snapshot_rx) = watch::channel(Arc::new(Snapshot::empty()));
        let (_revocations, revocation_rx) = watch::channel(Arc::new(RevocationList::new()));
        let (events, event_rx) = mpsc::channel(capacity);
        let hub = Hub::new(
            snapshot_rx,
            signing.verifier(),
            revocation_rx,
            events,
            HubOptions::default(),
        );
        (hub, event_rx)
    }

    fn claims(name: &str) -> Arc<Claims> {
        let claims = Claims::new(
            meshca_auth::ProxyType::Dataplane,
            "default",
            name,
            Default::default(),
            Default::default(),
            Duration::from_secs(60),
            1_000,
        )
        .expect("valid claims");
        Arc::new(claims)
    }

    /// What an event says, for comparing.
    fn said(event: &StreamEvent) -> String {
        match event {
            StreamEvent::Connected { stream, claims } => {
                format!("connected {stream} {}", claims.name)
            }
            StreamEvent::Subscribed { stream, resources } => {
                format!("subscribed {stream} {}", resources.len())
            }
            StreamEvent::Acked {
                stream,
                generation,
                version,
            } => format!("acked {stream} {generation} {version}"),
            StreamEvent::Nacked {
                stream,
                generation,
                version,
                message,
            } => format!("nacked {stream} {generation} {version} {message}"),
            StreamEvent::KeyOffered { stream, .. } => format!("key {stream}"),
            StreamEvent::Disconnected { stream } => format!("disconnected {stream}"),
            other => format!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_stream_reports_its_life_in_order_and_its_end_once() {
        let (hub, mut events) = hub_with_events(16);
        let reserved = hub.new_stream();
        let id = reserved.id();
        let stream = reserved.connect(claims("web")).await;
        assert_eq!(stream.id(), id, "connected under the id it reserved");
        stream
            .subscribe(meshca_control::parse_names(vec!["default".into()]))
            .await;
        stream.acknowledged(3, "v3".into()).await;
        stream.rejected(4, "v4".into(), "bad".into()).await;
        stream.close().await;
        // A reserved stream that never connects is never heard of; one dropped reports its end.
        drop(hub.new_stream());
        let other = hub.connect(claims("api")).await;
        let other_id = other.id();
        drop(other);
        drop(hub);
        let mut seen = Vec::new();
        while let Some(event) = events.recv().await {
            seen.push(said(&event));
        }
        assert_eq!(
            seen,
            [
                format!("connected {id} web"),
                format!("subscribed {id} 1"),
                format!("acked {id} 3 v3"),
                format!("nacked {id} 4 v4 bad"),
                format!("disconnected {id}"),
                format!("connected {other_id} api"),
                format!("disconnected {other_id}"),
            ]
        );
        assert_ne!(id, other_id, "ids are unique");
    }

    #[tokio::test]
    async fn a_full_event_channel_delays_events_but_never_drops_them() {
        let (hub, mut events) = hub_with_events(1);
        let first = hub.connect(claims("a")).await;
        let first_id = first.id();
        // The channel is full: a Drop hands its event to a task; a new stream waits to connect.
        drop(first);
        let mut waiting = Box::pin(hub.connect(claims("b")));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "a sender waits while the owner is behind"
        );
        let receive = async {
            let mut seen = Vec::new();
            for _ in 0..3 {
                let event = events.recv().await.expect("every event arrives");
                seen.push(said(&event));
            }
            seen
        };
        let (second, mut seen) = tokio::join!(waiting, receive);
        seen.sort();
        let mut expected = vec![
            format!("connected {first_id} a"),
            format!("disconnected {first_id}"),
            format!("connected {} b", second.id()),
        ];
        expected.sort();
        assert_eq!(seen, expected);
    }
}
