//! The state every stream of one server shares: the snapshot and revocation channels, the token
//! verifier, the event channel to the owner, the registry of open streams, the counters, and the
//! checks and reports every stream and fetch makes through them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use meshca_auth::{Claims, RevocationList, Verifier};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use meshca_control::{ProxyKey, Snapshot, StreamEvent, StreamId};

use crate::authn;
use crate::log_budget::LogBudget;
use crate::log_text::shown;
use crate::metrics::SdsMetrics;
use crate::options::ServerOptions;
use crate::registry::StreamRegistry;
use crate::wake::{Waiter, Wakes};

/// State shared by every stream of one server.
pub(crate) struct Shared {
    pub(crate) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(crate) verifier: Verifier,
    pub(crate) revocations: watch::Receiver<Arc<RevocationList>>,
    pub(crate) events: mpsc::Sender<StreamEvent>,
    pub(crate) options: ServerOptions,
    pub(crate) registry: StreamRegistry,
    pub(crate) metrics: Arc<SdsMetrics>,
    pub(crate) shutdown: CancellationToken,
    /// Log lines about refused requests, which anyone who can connect can cause.
    refusals_logged: LogBudget,
    next_id: AtomicU64,
    /// Where streams wait for the snapshots that concern them.
    wakes: Arc<Wakes>,
    /// Starts the task that wakes them, with the first stream (it needs the runtime).
    dispatcher: std::sync::Once,
}

impl Shared {
    pub(crate) fn new(
        snapshots: watch::Receiver<Arc<Snapshot>>,
        verifier: Verifier,
        revocations: watch::Receiver<Arc<RevocationList>>,
        events: mpsc::Sender<StreamEvent>,
        options: ServerOptions,
    ) -> Self {
        Shared {
            snapshots,
            verifier,
            revocations,
            events,
            registry: StreamRegistry::default(),
            metrics: Arc::new(SdsMetrics::default()),
            shutdown: CancellationToken::new(),
            refusals_logged: LogBudget::new(options.limits.warnings_per_minute),
            next_id: AtomicU64::new(1),
            wakes: Arc::default(),
            dispatcher: std::sync::Once::new(),
            options,
        }
    }

    /// A waiter for the streams of `key`, woken by the snapshots that concern them. Subscribe before
    /// reading the snapshot.
    pub(crate) fn waiter(&self, key: &ProxyKey) -> Waiter {
        self.dispatcher.call_once(|| {
            // The generation seen now is the dispatcher's start: any later publish wakes someone.
            let mut snapshots = self.snapshots.clone();
            let last = snapshots.borrow_and_update().generation;
            tokio::spawn(crate::wake::dispatch(
                self.wakes.clone(),
                snapshots,
                last,
                self.revocations.clone(),
                self.shutdown.clone(),
            ));
        });
        self.wakes.subscribe(key)
    }

    pub(crate) fn next_stream_id(&self) -> StreamId {
        StreamId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Reports an event to the owner. The channel is bounded: when the owner falls behind, the stream
    /// waits here (backpressure on that proxy) rather than dropping the event, which the owner's view
    /// of streams and ACKs depends on.
    pub(crate) async fn emit(&self, event: StreamEvent) {
        // The owner may have stopped listening during shutdown; nothing to do then.
        let _ = self.events.send(event).await;
    }

    /// [`Self::emit`] where nothing can wait (a `Drop`): sent at once when there is room, else by a
    /// task that waits for room. Never dropped while the owner listens.
    pub(crate) fn emit_from_drop(&self, event: StreamEvent) {
        match self.events.try_send(event) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                let events = self.events.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = events.send(event).await;
                    });
                }
            }
        }
    }

    pub(crate) fn auth_failure(&self, status: Status) -> Status {
        SdsMetrics::incr(&self.metrics.auth_failures);
        if let Some(suppressed) = self.refusals_logged.admit() {
            tracing::info!(
                code = ?status.code(),
                message = status.message(),
                suppressed,
                "SDS request refused"
            );
        }
        status
    }

    /// Refuses a request carrying a name longer than [`SdsLimits::name_bytes`] (`INVALID_ARGUMENT`)
    /// or more names than [`SdsLimits::names_per_stream`] (`RESOURCE_EXHAUSTED`).
    pub(crate) fn check_names<'r>(
        &self,
        names: impl Iterator<Item = &'r str>,
    ) -> Result<(), Status> {
        let most_bytes = self.options.limits.name_bytes;
        let mut count = 0;
        for name in names {
            count += 1;
            if name.len() > most_bytes {
                SdsMetrics::incr(&self.metrics.over_limit);
                return Err(Status::invalid_argument(format!(
                    "resource name {} is longer than {most_bytes} bytes (limits.nameBytes)",
                    shown(name),
                )));
            }
        }
        self.check_name_count(count)
    }

    /// Refuses a subscription of more than [`SdsLimits::names_per_stream`] names.
    pub(crate) fn check_name_count(&self, names: usize) -> Result<(), Status> {
        let most = self.options.limits.names_per_stream;
        if names > most {
            SdsMetrics::incr(&self.metrics.over_limit);
            return Err(Status::resource_exhausted(format!(
                "{names} resource names in one subscription; at most {most} are served \
                 (limits.namesPerStream)"
            )));
        }
        Ok(())
    }

    /// Verifies the bearer token of an SDS request against the current revocation list (a proxy's
    /// token only).
    pub(crate) fn authenticate(&self, headers: &http::HeaderMap) -> Result<Claims, Status> {
        let revoked = self.revocations.borrow().clone();
        authn::authenticate(headers, &self.verifier, &revoked, SystemTime::now())
            .map_err(|status| self.auth_failure(status))
    }

    /// Verifies the bearer token of a request against the current revocation list, whatever its type.
    pub(crate) fn verify_bearer(&self, headers: &http::HeaderMap) -> Result<Claims, Status> {
        let revoked = self.revocations.borrow().clone();
        authn::verify_bearer(headers, &self.verifier, &revoked, SystemTime::now())
            .map_err(|status| self.auth_failure(status))
    }
}
