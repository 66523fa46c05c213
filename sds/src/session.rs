//! What every authenticated stream and fetch shares: registration, events, waiting for
//! the proxy's identity, and watching for snapshot changes and revocations.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use meshca_auth::{Claims, RevocationList};
use meshca_control::{
    ClaimRule, ProxyEntry, ProxyKey, ResourceName, Snapshot, StreamId, TrustView,
};
use meshca_serve::{
    token_deadline, AttestedCheck, ConnProgress, HubStream, LogBudget, SnapshotWaiter,
    StreamMetrics,
};
use tokio::sync::watch;
use tonic::Status;

use crate::authn::Principal;
use crate::names::ProxyContext;
use crate::registry::{NewStream, Progress, SharedProgress, StreamKind, TooManyStreams};
use crate::shared::Shared;

/// One authenticated proxy conversation. Dropping a registered session unregisters the
/// stream; dropping its [`HubStream`] reports `Disconnected`.
pub(crate) struct Session {
    pub(crate) shared: Arc<Shared>,
    /// The stream, as the owner knows it.
    pub(crate) stream: HubStream,
    pub(crate) claims: Arc<Claims>,
    pub(crate) ctx: ProxyContext,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Woken by the snapshots that concern this proxy.
    waiter: SnapshotWaiter,
    /// The tokens revoked; checked whenever the stream wakes (a new list rings every stream).
    revocations: watch::Receiver<Arc<RevocationList>>,
    /// When the token stops being valid (its expiry plus the clock-skew leeway): the session ends then.
    expires: tokio::time::Instant,
    /// The token's expiry, which ends every wait, kept for the session's life: its waits register
    /// with the timer once, not at each of the session's wake-ups. (The server shutting down closes
    /// the waiter.)
    expiry: Pin<Box<tokio::time::Sleep>>,
    /// What the registry shows of this stream; `None` for a fetch, which is not registered.
    progress: Option<SharedProgress>,
    /// Warnings this proxy's streams may still log this minute (shared by its streams).
    warnings: Arc<LogBudget>,
    /// The claim rule the token was last checked against: a snapshot that carries the very same rule
    /// (its content unchanged) needs no new check.
    checked_rule: Option<Arc<ClaimRule>>,
    /// For a caller authenticated without a token: whether it may still be served, asked of every
    /// snapshot it is served from.
    attested: Option<AttestedCheck>,
}

/// A snapshot in which the proxy may be served (its identity Ready, or NoIdentity), with its entry
/// there, looked up once.
pub(crate) struct Usable {
    pub trust: TrustView,
    pub entry: ProxyEntry,
}

impl Session {
    /// Starts a session for a proxy whose token and node id were checked (or that was attested): for streams (`kind`
    /// set) registers it and counts it open, then reports `Connected`. A stream beyond the
    /// proxy's limit ([`crate::SdsLimits::streams_per_proxy`]) is refused with
    /// `RESOURCE_EXHAUSTED`.
    pub(crate) async fn open(
        shared: Arc<Shared>,
        principal: Principal,
        ctx: ProxyContext,
        kind: Option<StreamKind>,
    ) -> Result<Self, Status> {
        let Principal { claims, attested } = principal;
        if attested.is_none() {
            served_here(&shared.hub.snapshots().borrow(), &ctx)
                .map_err(|status| shared.auth_failure(status))?;
        }
        let limits = &shared.limits();
        let claims = Arc::new(claims);
        // The waiter first: a snapshot published after it is read below wakes it.
        let waiter = shared.hub.snapshot_waiter(&ctx.key);
        let snapshots = shared.hub.snapshots();
        let new_stream = shared.hub.new_stream();
        let id = new_stream.id();
        let (warnings, progress) = match kind {
            Some(kind) => {
                let opened = NewStream {
                    id,
                    proxy: ctx.key.clone(),
                    kind,
                    connected_at: SystemTime::now(),
                };
                let registered = shared.registry.insert(
                    opened,
                    limits.streams_per_proxy,
                    limits.warnings_per_minute,
                );
                match registered {
                    Ok((warnings, progress)) => (warnings, Some(progress)),
                    Err(TooManyStreams(open)) => {
                        StreamMetrics::incr(&shared.metrics().over_limit);
                        return Err(Status::resource_exhausted(format!(
                            "proxy {} already has {open} open SDS streams, the most one proxy may \
                             have (limits.streamsPerProxy)",
                            ctx.key
                        )));
                    }
                }
            }
            None => (Arc::new(LogBudget::new(limits.warnings_per_minute)), None),
        };
        if kind.is_some() {
            StreamMetrics::incr(&shared.metrics().streams_open);
        }
        let expires = token_deadline(claims.expires_at);
        let expiry = Box::pin(tokio::time::sleep_until(expires));
        let mut revocations = shared.hub.revocations();
        revocations.mark_changed();
        let stream = new_stream.connect(claims.clone()).await;
        tracing::debug!(stream = %id, proxy = %ctx.key, "proxy connected");
        Ok(Self {
            shared,
            stream,
            claims,
            ctx,
            snapshots,
            waiter,
            revocations,
            expires,
            expiry,
            progress,
            warnings,
            checked_rule: None,
            attested,
        })
    }

    /// Whether a warning about this proxy may be logged now; counts it when not. `Some(n)`: `n`
    /// were left out since the last one logged.
    pub(crate) fn may_warn(&self) -> Option<u64> {
        let admitted = self.warnings.admit();
        if admitted.is_none() {
            StreamMetrics::incr(&self.shared.metrics().log_lines_suppressed);
        }
        admitted
    }

    pub(crate) fn key(&self) -> &ProxyKey {
        &self.ctx.key
    }

    /// Whether the caller was authenticated without a token (its node id names nothing).
    pub(crate) fn is_attested(&self) -> bool {
        self.attested.is_some()
    }

    /// The stream's id.
    pub(crate) fn id(&self) -> StreamId {
        self.stream.id()
    }

    /// Records the stream's new subscription with the owner.
    pub(crate) async fn subscribed(&self, resources: Vec<ResourceName>) {
        self.stream.subscribe(resources).await;
    }

    /// Waits until the snapshot has this proxy Ready or NoIdentity, and returns that
    /// snapshot. Refused → `PERMISSION_DENIED`; still waiting after the identity wait →
    /// `UNAVAILABLE`.
    pub(crate) async fn wait_for_identity(&mut self) -> Result<Usable, Status> {
        let wait = self.shared.options().identity_wait;
        let current = self.snapshots.borrow_and_update().clone();
        if let Some(usable) = self.usable(current)? {
            return Ok(usable);
        }
        let timeout = Status::unavailable(format!(
            "the identity of proxy {} is not ready after {wait:?}: the daemon has not \
             prepared it yet (is the dataplane known, and does a MeshIdentity or mTLS \
             backend select it?); retry later",
            self.key(),
        ));
        tracing::debug!(proxy = %self.key(), "waiting for the proxy's identity");
        match tokio::time::timeout(wait, self.next_change()).await {
            Ok(result) => result,
            Err(_) => Err(timeout),
        }
    }

    /// Resolves with the next snapshot in which this proxy is Ready or NoIdentity (a
    /// Pending proxy keeps what it has). Fails when the proxy is refused, its token is
    /// revoked, or the server shuts down. Cancel-safe.
    pub(crate) async fn next_change(&mut self) -> Result<Usable, Status> {
        loop {
            // A new revocation list rings every stream's bell, and is read before anything is served;
            // one that came while the stream was not waiting is read here.
            self.check_revocation()?;
            let alive = {
                let (waiter, expiry) = (&mut self.waiter, self.expiry.as_mut());
                tokio::select! {
                    biased;
                    () = expiry => None,
                    alive = waiter.changed() => Some(alive),
                }
            };
            match alive {
                None => return Err(self.expired()),
                // The dispatcher closes the bells when the server shuts down.
                Some(false) => return Err(Status::unavailable("the SDS server is shutting down")),
                Some(true) => {
                    // The ring may have been the revocation's, with a new snapshot beside it.
                    self.check_revocation()?;
                    let snapshot = self.snapshots.borrow_and_update().clone();
                    if let Some(usable) = self.usable(snapshot)? {
                        return Ok(usable);
                    }
                }
            }
        }
    }

    /// Fails once the token has expired: nothing may be sent for it after that.
    pub(crate) fn check_expiry(&self) -> Result<(), Status> {
        if tokio::time::Instant::now() >= self.expires {
            return Err(self.expired());
        }
        Ok(())
    }

    fn expired(&self) -> Status {
        self.shared.auth_failure(Status::unauthenticated(format!(
            "token {} of proxy {} has expired; the proxy needs a new token",
            self.claims.id,
            self.key()
        )))
    }

    /// Fails when the revocation list, if it changed since last read, names this token.
    fn check_revocation(&mut self) -> Result<(), Status> {
        let revoked = match self.revocations.has_changed() {
            Ok(false) => false,
            // Changed, or its publisher is gone: then its last list, read each time, stays in force.
            Ok(true) | Err(_) => self
                .revocations
                .borrow_and_update()
                .contains(&self.claims.id),
        };
        if revoked {
            return Err(self.shared.auth_failure(Status::unauthenticated(format!(
                "token {} of proxy {} has been revoked",
                self.claims.id,
                self.key()
            ))));
        }
        Ok(())
    }

    fn usable(&mut self, snapshot: Arc<Snapshot>) -> Result<Option<Usable>, Status> {
        match &self.attested {
            Some(check) => {
                check(&snapshot).map_err(|status| self.shared.auth_failure(status))?;
            }
            None => served_here(&snapshot, &self.ctx)
                .map_err(|status| self.shared.auth_failure(status))?,
        }
        if let Some(rule) = snapshot.claim_rules.get(self.key()) {
            let checked = self
                .checked_rule
                .as_ref()
                .is_some_and(|last| Arc::ptr_eq(last, rule));
            if !checked {
                if let Err(reason) = rule.check(&self.claims) {
                    return Err(self.shared.auth_failure(Status::permission_denied(format!(
                        "token {} is refused for proxy {}: {reason}",
                        self.claims.id,
                        self.key()
                    ))));
                }
                self.checked_rule = Some(rule.clone());
            }
        }
        let entry = match snapshot.proxies.get(self.key()) {
            Some(entry @ (ProxyEntry::Ready(_) | ProxyEntry::NoIdentity { .. })) => entry.clone(),
            Some(ProxyEntry::Pending) | None => return Ok(None),
            Some(ProxyEntry::Refused { reason }) => {
                return Err(self.shared.auth_failure(Status::permission_denied(format!(
                    "proxy {} is refused: {reason}",
                    self.key()
                ))))
            }
        };
        Ok(Some(Usable {
            trust: snapshot.trust_view(),
            entry,
        }))
    }

    /// Records the stream's new subscription; refuses it (`RESOURCE_EXHAUSTED`) when its proxy
    /// would subscribe to more names than [`crate::SdsLimits::names_per_proxy`] over all its streams.
    pub(crate) fn subscribe(&self, resources: Vec<String>) -> Result<(), Status> {
        if self.progress.is_none() {
            return Ok(());
        }
        let most = self.shared.limits().names_per_proxy;
        self.shared
            .registry
            .subscribe(self.id(), resources, most)
            .map_err(|total| {
                StreamMetrics::incr(&self.shared.metrics().over_limit);
                Status::resource_exhausted(format!(
                    "proxy {} would subscribe to {total} resource names over its streams; at most \
                     {most} are served (limits.namesPerProxy)",
                    self.key()
                ))
            })
    }

    /// Records what the stream sent or heard, for the registry.
    pub(crate) fn update_info(&self, change: impl FnOnce(&mut Progress)) {
        if let Some(progress) = &self.progress {
            change(&mut progress.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.progress.is_some() {
            self.shared.registry.remove(self.id());
            StreamMetrics::decr(&self.shared.metrics().streams_open);
        }
        // Every session reported `Connected`, fetches included: its stream, dropped with it, tells the
        // owner that it ended, or a fetching proxy would count as connected (and be renewed) forever.
        tracing::debug!(stream = %self.id(), proxy = %self.ctx.key, "proxy disconnected");
    }
}

/// Refuses a token for a Dataplane that a `meshca agent` serves (a WorkloadRegistration names one):
/// its keys are made and kept on the agent's host, and only that agent is sent its certificates.
fn served_here(snapshot: &Snapshot, ctx: &ProxyContext) -> Result<(), Status> {
    if ctx.zone_egress {
        return Ok(());
    }
    match snapshot.registrations.agent_of(&ctx.key) {
        None => Ok(()),
        Some(agent) => Err(Status::permission_denied(format!(
            "dataplane {}/{} is served by meshca agent {agent}: its key is on that host",
            ctx.key.mesh, ctx.key.name
        ))),
    }
}

/// How many identity waits a stream may wait for its first request while its connection keeps
/// carrying data, or while the server is busy: the longest a busy server lets a well-behaved client's
/// request queue.
const FIRST_REQUEST_PERIODS: u32 = 4;

/// What a connection must carry (both ways) in an identity wait for its streams' first requests to wait
/// another: one HTTP/2 frame of the largest size.
const FIRST_REQUEST_PROGRESS: u64 = 16 * 1024;

/// The server was busy in an identity wait when it spent at least this share of one core's time in
/// it (its CPU time over the wait, every thread together), or its runtime's workers were awake with
/// work for this share of one worker's time ([`meshca_serve::Load`]): a half.
const BUSY_SHARE_OF_A_CORE: f64 = 0.5;

/// Awaits the first request of a stream, bounded by the identity wait. `None` when the proxy closed the
/// stream first; the status when its request could not be read.
///
/// A client that sent its request with its stream can still find it queued, for two reasons, so when
/// the wait ends for either the stream waits another, up to [`FIRST_REQUEST_PERIODS`] in all:
/// - HTTP/2 flow control holds it behind the requests of the connection's other streams until the
///   server, busy, reads and answers them: the stream's connection (`progress`) carried at least
///   [`FIRST_REQUEST_PROGRESS`] bytes in the wait;
/// - the server was busy ([`BUSY_SHARE_OF_A_CORE`]): its connection tasks and handlers read late, and a
///   client on the same cores is starved of the time to send or to read. A 100,000-stream bench showed
///   connections whose reader had not been polled for 6 s when the wait ended, and a daemon starved of
///   the cores by its clients (0.75 of a core for 20 s, its threads waiting to run 1.8 s a second): it
///   spends little CPU time, but its workers never sleep.
///
/// A client that sends nothing on a quiet connection to a server with time on its hands (a slow loris)
/// is closed after one wait, and any after four.
pub(crate) async fn first_request<T, F>(
    shared: &Shared,
    next: F,
    progress: Option<&ConnProgress>,
) -> Result<Option<T>, Status>
where
    F: Future<Output = Result<Option<T>, Status>>,
{
    let wait = shared.options().identity_wait;
    let load_clock = shared.options().load_clock;
    let mut deadline = tokio::time::Instant::now() + wait;
    let mut carried = progress.map(ConnProgress::carried);
    let mut load = load_clock();
    let mut periods = 1;
    tokio::pin!(next);
    loop {
        tokio::select! {
            // A request that is there when the wait ends is taken.
            biased;
            received = &mut next => return match received {
                Ok(request) => Ok(request),
                // A request that could not be read (too large, malformed): the proxy is told why, if
                // it is still there.
                Err(status) => {
                    tracing::debug!(%status, "stream failed before its first request");
                    Err(status)
                }
            },
            () = shared.hub.closed() => return Err(Status::unavailable("the SDS server is shutting down")),
            () = tokio::time::sleep_until(deadline) => {
                let now = progress.map(ConnProgress::carried);
                let sending = matches!(
                    (carried, now),
                    (Some(then), Some(now)) if now.saturating_sub(then) >= FIRST_REQUEST_PROGRESS
                );
                let load_now = load_clock();
                let busy = load_now.busy_since(&load, wait, BUSY_SHARE_OF_A_CORE);
                if !(sending || busy) || periods >= FIRST_REQUEST_PERIODS {
                    return Err(Status::deadline_exceeded(format!(
                        "no discovery request within {:?} of opening the stream",
                        wait * periods
                    )));
                }
                carried = now;
                load = load_now;
                periods += 1;
                deadline += wait;
            }
        }
    }
}
