//! The owner's task: stream events, resource reloads, renewals, CA rotation steps and certificates
//! coming back from the issuance threads, each followed by one reconcile when it needs one, and status
//! requests, answered between two of them.
//!
//! Reading and checking the resources directory (files, provided CAs, the keystore) runs on a
//! blocking thread, never in the loop: while an update loads, streams are still served, ACKs
//! counted and certificates renewed. The update is applied when it has loaded; reloads asked for
//! meanwhile are gathered into one more load after it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_config::Settings;
use meshca_federation::{HeldBundles, Peer};
use meshca_keystore::Keystore;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::UpdateError;
use crate::events::StreamEvent;
use crate::gate::ServedSince;
use crate::owner::status::{Detail, Status};
use crate::owner::{Completed, IssuedIdentity, Owner, RecordLink, SignedUntil};
use crate::peers::{GateView, PeerView};
use crate::snapshot::ProxyKey;
use crate::world::{load_world, CaSource, LoadMode, World};

/// How long the loop sleeps when nothing is due (it wakes earlier for any event).
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// How long a status request waits for the loop before it gives up (the loop is busy with a long
/// turn, or gone).
const STATUS_WAIT: Duration = Duration::from_secs(10);

/// How many status requests may queue for the loop.
const STATUS_QUEUE: usize = 64;

/// The least time between two views of this replica's rollouts for its peers: a view walks every
/// issued certificate, so a burst of events yields one view at its end, not one per event.
const VIEW_EVERY: Duration = Duration::from_millis(200);

/// How the loop and the other replicas on one database tell each other about their rollouts.
#[derive(Debug)]
pub struct PeerLink {
    /// The other live replicas' views, as the database last said.
    pub peers: watch::Receiver<Vec<PeerView>>,
    /// Where this replica's view goes whenever it changes.
    pub view: watch::Sender<Arc<GateView>>,
    /// Where issued identities are recorded and recorded ones asked for.
    pub records: RecordLink,
    /// The recorded identities asked for (`None`: none, or unreadable).
    pub found: mpsc::UnboundedReceiver<(ProxyKey, Option<IssuedIdentity>)>,
}

/// The loop's side of a [`PeerLink`].
#[derive(Debug)]
struct Peering {
    peers: watch::Receiver<Vec<PeerView>>,
    view: watch::Sender<Arc<GateView>>,
    found: mpsc::UnboundedReceiver<(ProxyKey, Option<IssuedIdentity>)>,
    /// When the next view may be built.
    next_view: tokio::time::Instant,
    /// Something happened since the last view was built.
    stale: bool,
}

/// The outcome of a reload: accepted, or every error that rejected it.
pub type ReloadOutcome = Result<(), Vec<UpdateError>>;

/// A request to reload the resources directory; `done` hears the outcome once the update is served
/// (or rejected).
#[derive(Debug, Default)]
pub struct Reload {
    /// Told the outcome, if someone waits.
    pub done: Option<oneshot::Sender<ReloadOutcome>>,
    /// A new `defaults.mesh` (the mesh whose identity the zone egress uses) to serve from this reload
    /// on; `None` keeps the current one.
    pub default_mesh: Option<Option<String>>,
}

/// A status request: built by the loop between two turns, from its current state.
#[derive(Debug)]
struct StatusQuery {
    detail: Detail,
    reply: oneshot::Sender<StatusReply>,
}

/// A status and the configuration it describes.
#[derive(Debug)]
pub struct StatusReply {
    /// The status, built when asked for.
    pub status: Status,
    /// The configuration serving when it was built.
    pub world: Arc<World>,
}

/// Why no status came back.
#[derive(Debug, thiserror::Error)]
pub enum StatusUnavailable {
    /// The loop did not answer within the wait: it is busy with a long turn.
    #[error("the control loop did not answer within {}s: it is busy with one long step (a large issuance wave or reload)", .0.as_secs_f64())]
    Busy(Duration),
    /// The loop has stopped.
    #[error("the control loop has stopped")]
    Stopped,
}

/// Asks the owner loop for its status. Cheap to clone.
#[derive(Clone, Debug)]
pub struct StatusHandle {
    tx: mpsc::Sender<StatusQuery>,
}

impl StatusHandle {
    /// The owner's status now, built by the loop between two of its turns.
    pub async fn get(&self, detail: Detail) -> Result<StatusReply, StatusUnavailable> {
        self.get_within(detail, STATUS_WAIT).await
    }

    /// The same, waiting at most `wait` for the loop.
    pub async fn get_within(
        &self,
        detail: Detail,
        wait: Duration,
    ) -> Result<StatusReply, StatusUnavailable> {
        let (reply, answer) = oneshot::channel();
        let asked = async {
            self.tx
                .send(StatusQuery { detail, reply })
                .await
                .map_err(|_| StatusUnavailable::Stopped)?;
            answer.await.map_err(|_| StatusUnavailable::Stopped)
        };
        tokio::time::timeout(wait, asked)
            .await
            .map_err(|_| StatusUnavailable::Busy(wait))?
    }

    /// The full status document.
    pub async fn status(&self) -> Result<Status, StatusUnavailable> {
        Ok(self.get(Detail::Full).await?.status)
    }
}

/// The owner and everything it listens to. [`OwnerLoop::run`] is the daemon's reconciler task.
#[derive(Debug)]
pub struct OwnerLoop {
    owner: Owner,
    settings: Settings,
    keystore: Arc<dyn Keystore>,
    events: mpsc::Receiver<StreamEvent>,
    reloads: mpsc::Receiver<Reload>,
    /// Certificates issued on the issuance threads.
    issued: mpsc::UnboundedReceiver<Vec<Completed>>,
    shutdown: CancellationToken,
    /// The update loading now, if any.
    loading: Option<Loading>,
    /// Requesters of a reload asked for while one was loading: served by the next load.
    queued: Option<Vec<oneshot::Sender<ReloadOutcome>>>,
    health: Arc<LoopHealth>,
    queries: mpsc::Receiver<StatusQuery>,
    status_handle: StatusHandle,
    peering: Option<Peering>,
    federation: Option<FederationLink>,
}

/// The loop's link to the federation importer: the peers the accepted world names go out, the bundles
/// held for them come in.
#[derive(Debug)]
pub struct FederationLink {
    /// The peers to follow, sent whenever an accepted world changes them.
    pub peers: watch::Sender<Arc<Vec<Peer>>>,
    /// The bundles held for them.
    pub held: watch::Receiver<Arc<HeldBundles>>,
    /// The accepted world, sent whenever it changes (the bundle endpoints issue their SVIDs from its
    /// CAs).
    pub world: watch::Sender<Arc<World>>,
    /// When the bundle endpoints first served each authority.
    pub served: watch::Receiver<Arc<ServedSince>>,
    /// When the last certificate each CA signed expires (the bundle endpoints keep serving a removed
    /// CA until then).
    pub signed: watch::Sender<Arc<SignedUntil>>,
}

/// What changed on the federation side.
enum FromFederation {
    /// The bundles held for the peers.
    Held(Arc<HeldBundles>),
    /// What the bundle endpoints served.
    Served(Arc<ServedSince>),
}

/// A resource update loading on a blocking thread.
#[derive(Debug)]
struct Loading {
    task: JoinHandle<ReloadResult>,
    waiting: Vec<oneshot::Sender<ReloadOutcome>>,
}

type ReloadResult = Result<World, Vec<UpdateError>>;

/// Whether the loop keeps turning, for `/ready`: when it started the work it is doing now; and how
/// much work it has done, for measuring what one event costs.
#[derive(Debug, Default)]
pub struct LoopHealth {
    /// Milliseconds since the Unix epoch when the current turn began; 0 between turns.
    busy_since_ms: AtomicU64,
    /// When the current turn began, for [`LoopHealth::work`].
    turn_started: std::sync::Mutex<Option<std::time::Instant>>,
    /// Turns finished.
    turns: AtomicU64,
    /// Nanoseconds spent in finished turns.
    busy_nanos: AtomicU64,
    /// After the last turn: proxies left for later turns, plus certificates being issued.
    backlog: AtomicU64,
}

/// The loop's work so far: turns finished and the time they took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Turns finished (a batch of stream events, a reload, a timer).
    pub turns: u64,
    /// The time those turns took.
    pub busy: Duration,
}

impl LoopHealth {
    /// How long the loop has been busy with one turn (a reconcile, a CA rotation), if it is.
    pub fn busy_for(&self, now: SystemTime) -> Option<Duration> {
        let since = self.busy_since_ms.load(Ordering::Acquire);
        (since != 0).then(|| {
            let now_ms = millis(now);
            Duration::from_millis(now_ms.saturating_sub(since))
        })
    }

    /// What the loop had left to do after its last turn: proxies it left for later turns, and
    /// certificates being issued. 0 when it waits for events only.
    pub fn backlog(&self) -> u64 {
        self.backlog.load(Ordering::Acquire)
    }

    /// The turns finished so far and the time they took.
    pub fn work(&self) -> Work {
        Work {
            turns: self.turns.load(Ordering::Acquire),
            busy: Duration::from_nanos(self.busy_nanos.load(Ordering::Acquire)),
        }
    }

    fn begin(&self) {
        self.busy_since_ms
            .store(millis(SystemTime::now()).max(1), Ordering::Release);
        *self.turn_started.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now());
    }

    fn end(&self) {
        let started = self
            .turn_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(started) = started {
            let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.busy_nanos.fetch_add(nanos, Ordering::AcqRel);
            self.turns.fetch_add(1, Ordering::AcqRel);
        }
        self.busy_since_ms.store(0, Ordering::Release);
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl OwnerLoop {
    /// A loop for `owner`, reloading the resources of `settings` with CAs from `keystore`.
    pub fn new(
        mut owner: Owner,
        settings: Settings,
        keystore: Arc<dyn Keystore>,
        events: mpsc::Receiver<StreamEvent>,
        reloads: mpsc::Receiver<Reload>,
        shutdown: CancellationToken,
    ) -> OwnerLoop {
        let (tx, queries) = mpsc::channel(STATUS_QUEUE);
        let issued = owner.issue_in_background();
        OwnerLoop {
            issued,
            queries,
            status_handle: StatusHandle { tx },
            owner,
            settings,
            keystore,
            events,
            reloads,
            shutdown,
            loading: None,
            queued: None,
            health: Arc::default(),
            peering: None,
            federation: None,
        }
    }

    /// Follows the federation peers the resources name through `link`, and trusts what it holds.
    pub fn with_federation(mut self, mut link: FederationLink) -> OwnerLoop {
        let held = link.held.borrow_and_update().clone();
        self.owner.set_federated(&held);
        let served = link.served.borrow_and_update().clone();
        self.owner.set_served(served);
        self.federation = Some(link);
        self.tell_federation();
        self
    }

    /// Tells the importer the peers the serving world names, when they changed, and the bundle
    /// endpoints the world.
    fn tell_federation(&mut self) {
        let Some(link) = &self.federation else {
            return;
        };
        let world = self.owner.world().clone();
        link.world.send_if_modified(|current| {
            if Arc::ptr_eq(current, &world) {
                return false;
            }
            *current = world;
            true
        });
        let peers: Vec<Peer> = self
            .owner
            .world()
            .federation
            .values()
            .map(|d| d.peer.clone())
            .collect();
        link.peers.send_if_modified(|current| {
            if **current == peers {
                return false;
            }
            *current = Arc::new(peers);
            true
        });
    }

    /// Tells the bundle endpoints when the last certificate of each CA expires, when that changed.
    fn tell_signed(&mut self) {
        let Some(link) = &self.federation else {
            return;
        };
        if let Some(signed) = self.owner.take_signed(SystemTime::now()) {
            link.signed.send_replace(signed);
        }
    }

    /// Gates rollouts over the replicas of `link` too (replicas on one database).
    pub fn with_peers(mut self, link: PeerLink) -> OwnerLoop {
        self.owner.record_through(link.records);
        self.owner.expect_peers();
        self.peering = Some(Peering {
            peers: link.peers,
            view: link.view,
            found: link.found,
            next_view: tokio::time::Instant::now(),
            stale: true,
        });
        self
    }

    /// The settings it reloads with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The world it serves now.
    pub fn world(&self) -> &Arc<World> {
        self.owner.world()
    }

    /// Where the admin API asks for the status.
    pub fn status_handle(&self) -> StatusHandle {
        self.status_handle.clone()
    }

    /// Whether the loop keeps turning; read by `/ready`.
    pub fn health(&self) -> Arc<LoopHealth> {
        self.health.clone()
    }

    /// Runs until `shutdown` fires or the event or reload channel closes.
    pub async fn run(mut self) {
        let mut next_due = self.reconcile();
        self.publish_view();
        loop {
            let wait = next_due
                .map(|t| t.duration_since(SystemTime::now()).unwrap_or_default())
                .unwrap_or(IDLE_WAKE);
            let view_at = self
                .peering
                .as_ref()
                .and_then(|p| p.stale.then_some(p.next_view));
            // A read of the peers that changed nothing changes nothing this replica tells them.
            let mut quiet = false;
            let dirty = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = self.events.recv() => {
                    let Some(event) = event else { return };
                    self.on_events(event)
                }
                Some(done) = self.issued.recv() => {
                    let dirty = self.on_issued(done);
                    // The certificates taken in have renewal times of their own, which the loop
                    // must wake for even when no reconcile follows.
                    next_due = self.owner.next_due();
                    dirty
                }
                Some(query) = self.queries.recv() => {
                    self.answer(query);
                    false
                }
                request = self.reloads.recv() => {
                    let Some(first) = request else { return };
                    self.on_reload_requests(first);
                    false
                }
                loaded = finished(&mut self.loading) => {
                    next_due = self.on_loaded(loaded);
                    false
                }
                () = tokio::time::sleep(wait) => {
                    self.rotate_if_due();
                    true
                }
                event = from_peers(&mut self.peering) => match event {
                    FromPeers::Views => {
                        let dirty = self.take_peers();
                        quiet = !dirty;
                        dirty
                    }
                    FromPeers::Found(key, held) => {
                        self.health.begin();
                        self.owner.adopt(key, held, SystemTime::now())
                    }
                },
                () = view_due(view_at) => {
                    false
                }
                change = federated(&mut self.federation) => {
                    self.health.begin();
                    match change {
                        FromFederation::Held(held) => self.owner.set_federated(&held),
                        FromFederation::Served(served) => self.owner.set_served(served),
                    }
                }
                // Quiet proxies a full reconcile left for later, a chunk per turn, in between the
                // other events, once the issuance threads run short of work.
                () = std::future::ready(()), if self.owner.deferred_due() => {
                    self.health.begin();
                    tokio::task::block_in_place(|| self.owner.serve_deferred(SystemTime::now()));
                    next_due = self.owner.next_due();
                    false
                }
            };
            if dirty {
                next_due = self.reconcile();
            }
            self.tell_signed();
            if !quiet {
                self.publish_view();
            }
            self.health
                .backlog
                .store(self.owner.backlog() as u64, Ordering::Release);
            self.health.end();
        }
    }

    /// Hands the peers' latest views to the owner; whether a reconcile is needed.
    fn take_peers(&mut self) -> bool {
        self.health.begin();
        let Some(peering) = &mut self.peering else {
            return false;
        };
        let peers = peering.peers.borrow_and_update();
        self.owner.set_peers(&peers)
    }

    /// Builds this replica's view for its peers after a turn, at most once per [`VIEW_EVERY`] (a
    /// turn within it leaves the view to [`view_due`]), and sends it when it changed.
    fn publish_view(&mut self) {
        let Some(peering) = &mut self.peering else {
            return;
        };
        peering.stale = true;
        let now = tokio::time::Instant::now();
        if now < peering.next_view {
            return;
        }
        peering.stale = false;
        peering.next_view = now + VIEW_EVERY;
        let view = tokio::task::block_in_place(|| self.owner.gate_view());
        peering.view.send_if_modified(|current| {
            if **current == view {
                return false;
            }
            *current = Arc::new(view);
            true
        });
    }

    /// Builds the status a request asks for (from the state of the last turn) and sends it.
    fn answer(&self, query: StatusQuery) {
        self.health.begin();
        let status =
            tokio::task::block_in_place(|| self.owner.status(SystemTime::now(), query.detail));
        let world = self.owner.world().clone();
        // The requester may have stopped waiting.
        let _ = query.reply.send(StatusReply { status, world });
    }

    /// Applies `first` and every event already queued behind it; whether a reconcile is needed.
    fn on_events(&mut self, first: StreamEvent) -> bool {
        self.health.begin();
        let mut dirty = self.owner.on_event(first);
        while let Ok(event) = self.events.try_recv() {
            dirty |= self.owner.on_event(event);
        }
        dirty
    }

    /// Takes in `first` and every other result already in; whether a reconcile is needed.
    fn on_issued(&mut self, first: Vec<Completed>) -> bool {
        self.health.begin();
        let mut done = first;
        while let Ok(more) = self.issued.try_recv() {
            done.extend(more);
        }
        tokio::task::block_in_place(|| self.owner.on_issued(done, SystemTime::now()))
    }

    /// Starts loading the resources for `first` and every request queued behind it, or, while an
    /// update is loading, queues them for one more load after it (the files may have changed since
    /// it began).
    fn on_reload_requests(&mut self, first: Reload) {
        let mut waiting = Vec::new();
        let mut request = Some(first);
        while let Some(Reload { done, default_mesh }) = request {
            waiting.extend(done);
            if let Some(mesh) = default_mesh {
                tracing::info!(mesh = ?mesh, "defaults.mesh changed");
                self.settings.defaults.mesh = mesh.clone();
                self.owner.set_default_mesh(mesh);
            }
            request = self.reloads.try_recv().ok();
        }
        if self.loading.is_some() {
            self.queued.get_or_insert_with(Vec::new).extend(waiting);
        } else {
            self.start_loading(waiting);
        }
    }

    fn start_loading(&mut self, waiting: Vec<oneshot::Sender<ReloadOutcome>>) {
        let settings = self.settings.clone();
        let keystore = self.keystore.clone();
        let previous = self.owner.world().clone();
        let task = tokio::task::spawn_blocking(move || {
            load_world(
                &settings,
                keystore.as_ref(),
                Some(&previous),
                SystemTime::now(),
            )
        });
        self.loading = Some(Loading { task, waiting });
    }

    /// Applies a loaded update (or records its rejection), reconciles, tells each requester the
    /// outcome (so a caller that waited sees the update served), and starts the queued reload if
    /// any. Returns when something is next due.
    fn on_loaded(
        &mut self,
        (loaded, waiting): (ReloadResult, Vec<oneshot::Sender<ReloadOutcome>>),
    ) -> Option<SystemTime> {
        self.health.begin();
        let now = SystemTime::now();
        let outcome = match loaded {
            Ok(world) => {
                tracing::info!("resource update applied");
                self.owner.accept(world);
                Ok(())
            }
            Err(errors) => {
                self.owner.reject(errors.clone(), now);
                Err(errors)
            }
        };
        self.tell_federation();
        let next_due = self.reconcile();
        for done in waiting {
            // The requester may have stopped waiting.
            let _ = done.send(outcome.clone());
        }
        if let Some(queued) = self.queued.take() {
            self.start_loading(queued);
        }
        next_due
    }

    /// Re-evaluates the serving resources when an automatic CA rotation step is due.
    fn rotate_if_due(&mut self) {
        self.health.begin();
        let now = SystemTime::now();
        if self
            .owner
            .world()
            .next_rotation_event()
            .is_some_and(|t| t <= now)
        {
            tokio::task::block_in_place(|| {
                rotate_cas(&mut self.owner, &self.settings, self.keystore.as_ref(), now)
            });
            self.tell_federation();
        }
    }

    fn reconcile(&mut self) -> Option<SystemTime> {
        tokio::task::block_in_place(|| self.owner.reconcile(SystemTime::now()))
    }
}

/// What came from the other replicas.
enum FromPeers {
    /// Their views changed.
    Views,
    /// A recorded identity asked for.
    Found(ProxyKey, Option<IssuedIdentity>),
}

/// Resolves with the next thing from the other replicas: their views changed, or a recorded identity
/// asked for came back. Never without peers, nor from a channel that closed (the daemon is stopping).
async fn from_peers(peering: &mut Option<Peering>) -> FromPeers {
    let Some(p) = peering else {
        return std::future::pending().await;
    };
    tokio::select! {
        Ok(()) = p.peers.changed() => FromPeers::Views,
        Some((key, held)) = p.found.recv() => FromPeers::Found(key, held),
        else => std::future::pending().await,
    }
}

/// Resolves with what changed on the federation side: the bundles the importer holds, or what the
/// bundle endpoints served; never without federation, nor from channels that closed (the daemon is
/// stopping).
async fn federated(link: &mut Option<FederationLink>) -> FromFederation {
    let Some(link) = link else {
        return std::future::pending().await;
    };
    tokio::select! {
        Ok(()) = link.held.changed() => FromFederation::Held(link.held.borrow_and_update().clone()),
        Ok(()) = link.served.changed() => FromFederation::Served(link.served.borrow_and_update().clone()),
        else => std::future::pending().await,
    }
}

/// Resolves at `at`, when a view held back by [`VIEW_EVERY`] is due; never without one.
async fn view_due(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves when the loading update (if any) has loaded, with its result and its requesters; never
/// while none is loading.
async fn finished(
    loading: &mut Option<Loading>,
) -> (ReloadResult, Vec<oneshot::Sender<ReloadOutcome>>) {
    let Some(current) = loading.as_mut() else {
        return std::future::pending().await;
    };
    let joined = (&mut current.task).await;
    let waiting = loading.take().map(|done| done.waiting).unwrap_or_default();
    let result = joined.unwrap_or_else(|error| {
        Err(vec![UpdateError {
            file: String::new(),
            resource: String::new(),
            field: String::new(),
            message: format!("loading the resources failed unexpectedly: {error}"),
        }])
    });
    (result, waiting)
}

/// Re-evaluates the serving resources at `now`: builtin CAs whose successor is due get it (the gate
/// orders its rollout like any new CA). On failure the current CAs keep serving.
pub fn rotate_cas(
    owner: &mut Owner,
    settings: &Settings,
    keystore: &dyn Keystore,
    now: SystemTime,
) {
    let resources = (*owner.world().resources).clone();
    let src = CaSource {
        keystore,
        mode: LoadMode::Apply,
        settings,
        previous: Some(owner.world()),
        now,
    };
    match World::load(resources, &src) {
        Ok(world) => owner.replace_world(world),
        Err(errors) => {
            for e in errors {
                tracing::error!("automatic CA rotation failed; the current CAs keep serving: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Condvar, Mutex};

    use meshca_auth::Claims;
    use meshca_keystore::{Creation, KeystoreError, MemoryKeystore, NewEntry, Secret};
    use tokio::sync::watch;

    use super::*;
    use crate::owner::{NoTelemetry, OwnerConfig};
    use crate::{ProxyEntry, ProxyKey, Snapshot, StreamId};

    /// A keystore whose key creation can be held back, to stand for a slow load.
    #[derive(Debug, Default)]
    struct HeldKeystore {
        inner: MemoryKeystore,
        /// (hold creations?, a creation is waiting)
        state: Mutex<(bool, bool)>,
        changed: Condvar,
    }

    impl HeldKeystore {
        fn set_hold(&self, hold: bool) {
            self.state.lock().expect("not poisoned").0 = hold;
            self.changed.notify_all();
        }

        /// Blocks until a creation waits behind the hold.
        fn wait_for_blocked_creation(&self) {
            let state = self.state.lock().expect("not poisoned");
            let _waiting = self
                .changed
                .wait_while(state, |(_, waiting)| !*waiting)
                .expect("not poisoned");
        }
    }

    impl Keystore for HeldKeystore {
        fn get_secret(&self, name: &str) -> Result<Option<Secret>, KeystoreError> {
            self.inner.get_secret(name)
        }
        fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
            self.inner.put_secret(name, data)
        }
        fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError> {
            self.inner.get_public(name)
        }
        fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
            self.inner.put_public(name, data)
        }
        fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError> {
            let mut state = self.state.lock().expect("not poisoned");
            state.1 = true;
            self.changed.notify_all();
            let mut state = self
                .changed
                .wait_while(state, |(hold, _)| *hold)
                .expect("not poisoned");
            state.1 = false;
            drop(state);
            self.inner.create_if_absent(entries)
        }
        fn delete(&self, name: &str) -> Result<(), KeystoreError> {
            self.inner.delete(name)
        }
        fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError> {
            self.inner.list(prefix)
        }
    }

    const MESH: &str = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - name: ca-1\n      type: builtin\n";

    /// A running loop serving the resources in `dir` with CAs from `keystore`.
    struct Running {
        snapshots: watch::Receiver<Arc<Snapshot>>,
        events: mpsc::Sender<StreamEvent>,
        reloads: mpsc::Sender<Reload>,
        shutdown: CancellationToken,
    }

    fn start(dir: &std::path::Path, keystore: Arc<dyn Keystore>) -> Running {
        let settings = Settings {
            resources: dir.to_path_buf(),
            ..Settings::default()
        };
        let world = load_world(&settings, keystore.as_ref(), None, SystemTime::now())
            .expect("valid resources");
        let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
        let owner = Owner::new(
            OwnerConfig::from_settings(&settings),
            world,
            Arc::new(NoTelemetry),
            snapshot_tx,
        );
        let (events, events_rx) = mpsc::channel(16);
        let (reloads, reloads_rx) = mpsc::channel(4);
        let shutdown = CancellationToken::new();
        let owner_loop = OwnerLoop::new(
            owner,
            settings,
            keystore,
            events_rx,
            reloads_rx,
            shutdown.clone(),
        );
        tokio::spawn(owner_loop.run());
        Running {
            snapshots,
            events,
            reloads,
            shutdown,
        }
    }

    /// Connects `web-1` of mesh `default` as stream 1, as its SDS stream would report it.
    async fn connect_web(events: &mpsc::Sender<StreamEvent>) -> ProxyKey {
        let tags = BTreeMap::from([("kuma.io/service".to_owned(), "web".to_owned())]);
        let claims = Claims::new_dataplane(
            "default",
            "web-1",
            BTreeMap::new(),
            tags,
            Duration::from_secs(3600),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_secs(),
        )
        .expect("valid claims");
        events
            .send(StreamEvent::Connected {
                stream: StreamId(1),
                claims: Arc::new(claims),
            })
            .await
            .expect("the loop listens");
        ProxyKey::new("default", "web-1")
    }

    /// Certificates come back from the issuance threads without a reconcile; the loop still wakes for
    /// their renewal. With a 1 s lifetime (NotBefore 10 s back), each is due as soon as it is issued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn certificates_taken_in_from_the_issuance_threads_are_renewed_when_due() {
        let dir = tempfile::tempdir().expect("temp dir");
        let short = MESH.replace(
            "type: builtin\n",
            "type: builtin\n      dpCert: {rotation: {expiration: 1s}}\n",
        );
        std::fs::write(dir.path().join("mesh.yaml"), short).expect("write");
        let mut running = start(dir.path(), Arc::new(MemoryKeystore::new()));
        let web = connect_web(&running.events).await;
        let mut served = std::collections::HashSet::new();
        let renewed = running.snapshots.wait_for(|s| {
            if let Some(ProxyEntry::Ready(identity)) = s.proxies.get(&web) {
                served.insert(identity.chain_pem.clone());
            }
            served.len() >= 3
        });
        tokio::time::timeout(Duration::from_secs(60), renewed)
            .await
            .expect("the certificate was renewed twice")
            .expect("the owner publishes");
        running.shutdown.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proxies_are_served_while_an_update_loads() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("mesh.yaml"), MESH).expect("write");
        let keystore = Arc::new(HeldKeystore::default());
        let Running {
            mut snapshots,
            events: events_tx,
            reloads: reload_tx,
            shutdown,
        } = start(dir.path(), keystore.clone());

        // An update whose new mesh needs a CA, held back while it is being created.
        let other = MESH.replace("name: default", "name: other");
        std::fs::write(dir.path().join("other.yaml"), other).expect("write");
        keystore.set_hold(true);
        let (done_tx, done) = oneshot::channel();
        reload_tx
            .send(Reload {
                done: Some(done_tx),
                default_mesh: None,
            })
            .await
            .expect("the loop listens");
        let held = keystore.clone();
        tokio::task::spawn_blocking(move || held.wait_for_blocked_creation())
            .await
            .expect("the load reaches the keystore");

        // Meanwhile a proxy connects, and gets its identity.
        let web = connect_web(&events_tx).await;
        // Waits for any decision about it, so that a wrong one fails here rather than hanging.
        let decided = snapshots.wait_for(|s| {
            s.proxies
                .get(&web)
                .is_some_and(|e| !matches!(e, ProxyEntry::Pending))
        });
        let snapshot = tokio::time::timeout(Duration::from_secs(60), decided)
            .await
            .expect("the proxy is decided while the update loads")
            .expect("the owner publishes")
            .clone();
        assert!(
            matches!(snapshot.proxies.get(&web), Some(ProxyEntry::Ready(_))),
            "{:?}",
            snapshot.proxies.get(&web)
        );

        let mut done = done;
        assert_eq!(
            done.try_recv(),
            Err(oneshot::error::TryRecvError::Empty),
            "the held update is still loading"
        );
        keystore.set_hold(false);
        assert_eq!(done.await.expect("the outcome is sent"), Ok(()));
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_request_gives_up_on_a_busy_loop_and_names_the_wait() {
        // A loop that takes the request and never answers: busy with one long step.
        let (tx, mut queries) = mpsc::channel(1);
        let handle = StatusHandle { tx };
        let busy = tokio::spawn(async move {
            let held = queries.recv().await;
            std::future::pending::<()>().await;
            drop(held);
        });
        let wait = Duration::from_secs(2);
        let error = handle
            .get_within(Detail::Summary, wait)
            .await
            .expect_err("nobody answers");
        assert!(
            matches!(error, StatusUnavailable::Busy(w) if w == wait),
            "{error:?}"
        );
        assert!(error.to_string().contains("within 2s"), "{error}");
        busy.abort();
        // A loop that is gone says so at once.
        let (tx, queries) = mpsc::channel(1);
        drop(queries);
        let error = StatusHandle { tx }
            .get(Detail::Full)
            .await
            .expect_err("the loop stopped");
        assert!(matches!(error, StatusUnavailable::Stopped), "{error:?}");
    }

    #[test]
    fn loop_health_says_how_long_a_turn_has_run() {
        let health = LoopHealth::default();
        let now = SystemTime::now();
        assert_eq!(health.busy_for(now), None, "idle");
        health.begin();
        let later = now + Duration::from_secs(45);
        assert!(health
            .busy_for(later)
            .is_some_and(|busy| busy >= Duration::from_secs(44)));
        health.end();
        assert_eq!(health.busy_for(later), None);
        assert_eq!(health.work().turns, 1);
        // Ending without a turn under way counts nothing.
        health.end();
        assert_eq!(health.work().turns, 1);
    }
}
