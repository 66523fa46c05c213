//! A running daemon: every listener bound, the owner loop, SDS and the admin API as tasks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_auth::AuthError;
use meshca_config::{ListenAddr, Settings};
use meshca_control::{
    load_world, FederationLink, GateView, LoopHealth, Owner, OwnerConfig, OwnerLoop, PeerLink,
    RecordLink, ReloadOutcome, Snapshot, StatusHandle, StreamEvent, UpdateError, World,
};
use meshca_keystore::Keystore;
use meshca_sds::SdsServer;
use meshca_serve::{BoundListeners, Hub, HubOptions, ListenError, Listener};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::admin::AdminListenError;
use super::bundle_endpoints::{self, EndpointError};
use super::daemon_keys::TlsIdentityError;
use super::data_dir::{DaemonLock, DataDir, DataDirError};
use super::federation::{self, FederationView};
use super::files::{ensure_resources, ResourcesError};
use super::limits::ServeLimits;
use super::reload::Reloader;
use super::replica::{DatabaseView, GateSync, Heartbeat};
use super::revocations::RevocationsError;
use super::store::{Store, StoreError};
use super::watcher::WatchError;
use super::workload_api::WorkloadApiError;
use super::{admin, admin_hosts, daemon_keys, metrics, revocations, watcher};
use super::{agent_api, workload_api};
use crate::error::{Result, TaskError};
use meshca_db::RecordSync;
use meshca_db::Replicas;
use meshca_federation::Importer;

/// Why the daemon did not start; nothing was started then.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// The data directory could not be opened or locked.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// The store, or the token signing key in it, could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The resources directory could not be made ready.
    #[error(transparent)]
    Resources(#[from] ResourcesError),
    /// The resources are invalid: every problem, one a line. Input the operator must fix.
    #[error("the resources are invalid; nothing was started:\n  {}", lines(.0))]
    InvalidResources(Vec<UpdateError>),
    /// The token revocation list could not be read (fail closed).
    #[error("refusing to start")]
    Revocations(#[source] RevocationsError),
    /// The SDS listeners could not be bound.
    #[error("cannot start the SDS listeners (sds.listen)")]
    SdsListeners(#[source] ListenError),
    /// The SDS TCP listeners have no TLS identity.
    #[error(transparent)]
    SdsTls(#[from] TlsIdentityError),
    /// The Workload API could not be started.
    #[error(transparent)]
    WorkloadApi(#[from] WorkloadApiError),
    /// The admin listener could not be bound.
    #[error(transparent)]
    AdminListener(#[from] AdminListenError),
    /// The admin listener's address could not be read.
    #[error(transparent)]
    AdminAddress(std::io::Error),
    /// The resources directory or the revocation list cannot be watched.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// A bundle endpoint (`federation.endpoints`) could not start.
    #[error(transparent)]
    BundleEndpoint(#[from] EndpointError),
}

/// The problems of [`StartError::InvalidResources`], one a line.
fn lines(errors: &[UpdateError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n  ")
}

/// Why the running daemon could not do what was asked of it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
    /// A proxy token could not be signed.
    #[error("cannot sign a token: {0}")]
    Sign(AuthError),
    /// The daemon stopped before a resources reload asked for was applied.
    #[error("the daemon stopped before applying the update")]
    StoppedBeforeUpdate,
    /// The daemon stopped before a new `defaults.mesh` was applied.
    #[error("the daemon stopped before applying defaults.mesh")]
    StoppedBeforeDefaultMesh,
}

/// How long shutdown waits for streams and tasks to finish.
const GRACE: Duration = Duration::from_secs(10);

/// Reload requests queued for the owner loop; more are merged into one reload anyway.
const RELOAD_QUEUE: usize = 16;

/// Options of an in-process daemon that no settings file can set.
#[derive(Clone, Copy, Debug)]
pub struct DaemonOptions {
    /// The rollout gate (docs/rotation.md). Only drills turn it off, to show what it prevents.
    pub gate: bool,
    /// Watch the resources directory and the revocation list.
    pub watch_files: bool,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            gate: true,
            watch_files: true,
        }
    }
}

/// A running daemon: its listeners, its status, and the handles to reload and stop it.
pub struct Daemon {
    /// Where SDS listens (real ports when 0 was asked).
    pub sds_addrs: Vec<meshca_serve::BoundAddr>,
    /// Where the admin API listens.
    pub admin_addr: std::net::SocketAddr,
    /// Where the Workload API listens (empty when it is off).
    pub workload_addrs: Vec<meshca_serve::BoundAddr>,
    /// Asks the owner for its status.
    pub status: StatusHandle,
    /// Follows the federation peers the resources name.
    pub federation: Importer,
    /// The SPIFFE bundle endpoints it serves (`federation.endpoints`), with their real addresses.
    pub bundle_endpoints: Vec<bundle_endpoints::BoundEndpoint>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    loop_health: Arc<LoopHealth>,
    signing_key: meshca_auth::SigningKey,
    reloader: Reloader,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<Result<(), TaskError>>,
    _watcher: Option<notify::RecommendedWatcher>,
    /// Held until the daemon is dropped (after [`Daemon::stop`] drained it).
    _lock: DaemonLock,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("sds_addrs", &self.sds_addrs)
            .field("admin_addr", &self.admin_addr)
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Loads everything, binds every listener and starts serving. Invalid settings or resources are
    /// an [`crate::Error::InvalidInput`]; nothing is started then.
    pub async fn start(settings: Settings, options: DaemonOptions) -> Result<Daemon> {
        Ok(Daemon::start_steps(settings, options).await?)
    }

    /// [`Daemon::start`], step by step.
    async fn start_steps(settings: Settings, options: DaemonOptions) -> Result<Daemon, StartError> {
        // What a peer can make the HTTP libraries log goes through the same budget as the daemon's
        // own warnings about peers.
        meshca_serve::library_logs::set_warnings_per_minute(settings.limits.warnings_per_minute);
        let Opened {
            lock,
            store,
            limits,
            world,
            signing_key,
            revocations_source,
            revocations,
        } = Opened::open(&settings).await?;
        let shutdown = CancellationToken::new();
        let (federation_peers, peers_rx) = watch::channel(Arc::new(Vec::new()));
        let federation = FederationView {
            importer: Importer::spawn(
                peers_rx,
                store.keystore.clone(),
                federation::import_options(&settings),
                shutdown.clone(),
            ),
            stale_after: settings.federation.stale_after.as_std(),
        };
        let serving = Serving::new(
            revocations,
            &signing_key,
            &limits,
            store.token.clone(),
            &federation,
        );
        meshca_keystore::crash_point("bind the SDS listeners (creates the unix socket)");
        let listeners = Listeners::bind(&settings, store.keystore.as_ref()).await?;
        // Agents' workloads get JWT-SVIDs through the agent protocol, which the SDS listeners always
        // serve: the keys are loaded whether or not this host's own Workload API socket is on.
        let jwt_keys = workload_api::jwt_keys(store.keystore.clone(), &limits.workload.0).await?;
        let agents = meshca_agent_server::AgentServer::new(
            serving.sds.hub().clone(),
            jwt_keys.clone(),
            agent_api::options(&settings),
        );
        let (reload_tx, reload_rx) = mpsc::channel(RELOAD_QUEUE);
        let revocations_file = match &revocations_source {
            revocations::Source::File(path) => Some(path.clone()),
            revocations::Source::Database(_) => None,
        };
        let reloader = Reloader::new(
            reload_tx,
            revocations_source,
            serving.revocations_tx,
            serving.metrics.clone(),
        );
        let watcher = match options.watch_files {
            true => Some(watcher::watch(
                &settings.resources,
                revocations_file.as_deref(),
                reloader.clone(),
            )?),
            false => None,
        };
        let (database_tx, database_rx) = watch::channel(Arc::new(DatabaseView::default()));
        let heartbeat = heartbeat(
            &settings,
            &store,
            (&serving.sds, &serving.metrics),
            &database_tx,
            &reloader,
        );
        let owner = Owner::new(
            OwnerConfig {
                gate: options.gate,
                ..OwnerConfig::from_settings(&settings)
            },
            world,
            serving.metrics.clone(),
            serving.snapshot_tx,
        );
        let (replica_sync, peer_link) = replica_links(&settings, &store, database_tx);
        let allowed_hosts = admin_hosts::AllowedHosts::new(&settings.admin.allowed_hosts);
        let mut owner_loop = OwnerLoop::new(
            owner,
            settings,
            store.keystore.clone(),
            serving.events_rx,
            reload_rx,
            shutdown.clone(),
        );
        if let Some(link) = peer_link {
            owner_loop = owner_loop.with_peers(link);
        }
        let (world_tx, world_rx) = watch::channel(owner_loop.world().clone());
        let (served_since, served_rx) = watch::channel(Arc::default());
        let (signed_tx, signed) = watch::channel(Arc::default());
        owner_loop = owner_loop.with_federation(FederationLink {
            peers: federation_peers,
            held: federation.importer.held(),
            world: world_tx,
            served: served_rx,
            signed: signed_tx,
        });
        let bundle_endpoints = bundle_endpoints::start(
            owner_loop.settings(),
            bundle_endpoints::Sources {
                snapshots: serving.sds.hub().snapshots(),
                jwt_keys: jwt_keys.clone(),
                world: world_rx,
                keystore: store.keystore.clone(),
                served_since,
                signed,
            },
            &shutdown,
        )
        .await?;
        let served_bundles: bundle_endpoints::ServedBundles = bundle_endpoints
            .iter()
            .map(|e| {
                (
                    e.trust_domain.clone(),
                    (e.served.clone(), e.fetches.clone()),
                )
            })
            .collect();
        let loop_health = owner_loop.health();
        let ready = Arc::new(AtomicBool::new(false));
        let workload_api = listeners.workload.as_ref().map(|_| {
            meshca_workload::WorkloadApi::new(
                serving.sds.hub().clone(),
                limits.workload.0.clone(),
                jwt_keys.clone(),
            )
        });
        let admin_state = admin::AdminState {
            status: owner_loop.status_handle(),
            streams: serving.sds.registry(),
            workloads: admin::WorkloadsView {
                snapshots: serving.sds.hub().snapshots(),
                callers: workload_api
                    .as_ref()
                    .map(meshca_workload::WorkloadApi::callers),
                jwt_keys,
            },
            agents: agents.agents(),
            metrics: serving.metrics,
            ready: ready.clone(),
            owner_health: loop_health.clone(),
            database: heartbeat.is_some().then_some(database_rx),
            token: store.token.clone(),
            snapshots: serving.sds.hub().snapshots(),
            console: Default::default(),
            allowed_hosts,
            federation: federation.clone(),
            served_bundles,
        };
        let status = owner_loop.status_handle();
        let tasks = Tasks {
            owner_loop,
            sds: serving.sds,
            agents,
            heartbeat,
            replica_sync,
            poll_revocations: revocations_file.is_none(),
            token: store.token.clone(),
            admin_state,
        }
        .spawn(
            (listeners.sds, listeners.workload.zip(workload_api)),
            listeners.admin,
            &reloader,
            &shutdown,
            limits,
        );
        // Not a write, but the last moment of a start: a kill here leaves every file the start made.
        meshca_keystore::crash_point("report ready");
        ready.store(true, Ordering::Release);
        tracing::info!("meshca is ready");
        Ok(Daemon {
            sds_addrs: listeners.sds_addrs,
            admin_addr: listeners.admin_addr,
            workload_addrs: listeners.workload_addrs,
            status,
            federation: federation.importer,
            bundle_endpoints,
            snapshots: serving.snapshot_rx,
            loop_health,
            signing_key,
            reloader,
            shutdown,
            tasks,
            _watcher: watcher,
            _lock: lock,
        })
    }

    /// The control loop's health and work so far.
    pub fn loop_health(&self) -> &LoopHealth {
        &self.loop_health
    }

    /// The snapshots SDS serves, as they are published.
    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshots.clone()
    }

    /// The generation of the snapshot SDS serves now.
    pub fn generation(&self) -> u64 {
        self.snapshots.borrow().generation
    }

    /// The unix socket SDS listens on, as a client target (`unix:///path`), if any.
    pub fn unix_target(&self) -> Option<String> {
        self.sds_addrs.iter().find_map(|a| match a {
            meshca_serve::BoundAddr::Unix(p) => Some(format!("unix://{}", p.display())),
            _ => None,
        })
    }

    /// Mints a proxy token with the daemon's key.
    pub fn mint_token(&self, claims: &meshca_auth::Claims) -> Result<String> {
        Ok(self.signing_key.mint(claims).map_err(DaemonError::Sign)?)
    }

    /// Reloads the resources directory now and waits for the outcome.
    pub async fn reload_resources(&self) -> Result<ReloadOutcome> {
        Ok(self
            .reloader
            .resources()
            .await
            .ok_or(DaemonError::StoppedBeforeUpdate)?)
    }

    /// Serves `mesh` as `defaults.mesh` (the mesh whose identity the zone egress uses) from now on, as
    /// SIGHUP does after the settings file changed, and waits until the reload it comes with is served.
    pub async fn set_default_mesh(&self, mesh: Option<String>) -> Result<ReloadOutcome> {
        Ok(self
            .reloader
            .default_mesh(mesh)
            .await
            .ok_or(DaemonError::StoppedBeforeDefaultMesh)?)
    }

    /// What reloads resources and revocations (SIGHUP and the file watcher use it).
    pub(crate) fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// Waits until a daemon task fails (or ends, which is a failure too) or `shutdown` is cancelled.
    pub async fn wait(&mut self) -> Result<()> {
        Ok(self.wait_for_tasks().await?)
    }

    async fn wait_for_tasks(&mut self) -> Result<(), TaskError> {
        tokio::select! {
            _ = self.shutdown.cancelled() => Ok(()),
            done = self.tasks.join_next() => match done {
                None => Ok(()),
                Some(Ok(Ok(()))) => Err(TaskError::Ended),
                Some(Ok(Err(e))) => Err(e),
                Some(Err(e)) => Err(TaskError::Panicked(e)),
            },
        }
    }

    /// Stops at once, as a killed process does: no drain, streams cut, no more heartbeats. For
    /// the failover drill.
    pub fn kill(mut self) {
        self.shutdown.cancel();
        self.tasks.abort_all();
    }

    /// Drains streams and stops every task, waiting at most the grace period.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let drained = tokio::time::timeout(GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(grace = ?GRACE, "tasks still running after the grace period; exiting anyway");
        }
    }
}

/// What a start opens before anything serves: the data directory (locked), the store, the first
/// world, the token key and the revocation list.
struct Opened {
    lock: DaemonLock,
    store: Store,
    limits: ServeLimits,
    world: World,
    signing_key: meshca_auth::SigningKey,
    revocations_source: revocations::Source,
    revocations: meshca_auth::RevocationList,
}

impl Opened {
    async fn open(settings: &Settings) -> Result<Opened, StartError> {
        // Before anything in the data directory is created or written: one daemon per directory.
        let data_dir = DataDir::open(&settings.data_dir)?;
        let lock = data_dir.lock_for_daemon()?;
        // What a write killed before its rename left (the keystore cleans its own).
        crate::atomic_file::remove_stale_temps(&settings.data_dir);
        crate::atomic_file::remove_stale_temps(&settings.resources);
        let store = Store::open_waiting(settings, &data_dir).await?;
        let limits = ServeLimits::from_settings(settings);
        let world = load_initial_world(settings, store.keystore.as_ref())?;
        let signing_key = store.signing_key(&data_dir)?;
        // Fail closed: the list exists from the key's creation on, so missing or invalid stops the start.
        let revocations_source = match store.revocations() {
            Some(database) => revocations::Source::Database(database),
            None => revocations::Source::File(data_dir.revocation_list()),
        };
        let revocations = revocations_source
            .read()
            .await
            .map_err(StartError::Revocations)?;
        Ok(Opened {
            lock,
            store,
            limits,
            world,
            signing_key,
            revocations_source,
            revocations,
        })
    }
}

/// The SDS server and the channels between it, the owner and the reloader, with the metrics.
struct Serving {
    sds: SdsServer,
    metrics: Arc<metrics::Metrics>,
    revocations_tx: watch::Sender<Arc<meshca_auth::RevocationList>>,
    snapshot_tx: watch::Sender<Arc<Snapshot>>,
    snapshot_rx: watch::Receiver<Arc<Snapshot>>,
    events_rx: mpsc::Receiver<StreamEvent>,
}

impl Serving {
    fn new(
        revocations: meshca_auth::RevocationList,
        signing_key: &meshca_auth::SigningKey,
        limits: &ServeLimits,
        token: Option<meshca_hsm::Token>,
        federation: &FederationView,
    ) -> Serving {
        let (revocations_tx, revocations_rx) = watch::channel(Arc::new(revocations));
        let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(Snapshot::empty()));
        let (events_tx, events_rx) = mpsc::channel::<StreamEvent>(meshca_serve::EVENT_BUFFER);
        let sds = SdsServer::on(Hub::new(
            snapshot_rx.clone(),
            signing_key.verifier(),
            revocations_rx,
            events_tx,
            HubOptions::default().with_limits(limits.sds.clone()),
        ));
        let metrics = Arc::new(metrics::Metrics::new(
            sds.metrics(),
            token,
            Some(federation::FederationCollector {
                status: federation.importer.status(),
                stale_after: federation.stale_after,
            }),
        ));
        Serving {
            sds,
            metrics,
            revocations_tx,
            snapshot_tx,
            snapshot_rx,
            events_rx,
        }
    }
}

/// The SDS listeners, the Workload API's and the admin API's, bound.
struct Listeners {
    sds: BoundListeners,
    sds_addrs: Vec<meshca_serve::BoundAddr>,
    workload: Option<BoundListeners>,
    workload_addrs: Vec<meshca_serve::BoundAddr>,
    admin: tokio::net::TcpListener,
    admin_addr: std::net::SocketAddr,
}

impl Listeners {
    async fn bind(settings: &Settings, keystore: &dyn Keystore) -> Result<Listeners, StartError> {
        let sds = bind_sds(settings, keystore).await?;
        let sds_addrs = sds.local_addrs();
        let workload = workload_api::bind(settings).await?;
        let workload_addrs = workload
            .as_ref()
            .map(BoundListeners::local_addrs)
            .unwrap_or_default();
        let admin = admin::bind(settings.admin.listen).await?;
        let admin_addr = admin.local_addr().map_err(StartError::AdminAddress)?;
        tracing::info!(addr = %admin_addr, "admin API listening");
        if !admin_addr.ip().is_loopback() {
            tracing::warn!(
                addr = %admin_addr,
                "the admin API listens beyond loopback (admin.listen): anyone who can reach {admin_addr} sees every proxy, certificate expiry and rotation state, without authentication; put it on 127.0.0.1 or behind a firewall"
            );
        }
        Ok(Listeners {
            sds,
            sds_addrs,
            workload,
            workload_addrs,
            admin,
            admin_addr,
        })
    }
}

/// A replica's heartbeat, when it shares a database with others.
fn heartbeat(
    settings: &Settings,
    store: &Store,
    (sds, metrics): (&SdsServer, &Arc<metrics::Metrics>),
    database: &watch::Sender<Arc<DatabaseView>>,
    reloader: &Reloader,
) -> Option<Heartbeat> {
    store.database.clone().map(|db| Heartbeat {
        replicas: Replicas::new(db),
        name: settings.replica.name.clone(),
        lease: settings.replica.lease_timeout.as_std(),
        streams: sds.registry(),
        view: database.clone(),
        metrics: metrics.clone(),
        reloader: reloader.clone(),
    })
}

/// What replicas on one database run to gate their rollouts together: the gate and proxy-record
/// syncs, and the owner's end of them. Nothing without a database.
fn replica_links(
    settings: &Settings,
    store: &Store,
    database: watch::Sender<Arc<DatabaseView>>,
) -> (Option<(GateSync, RecordSync)>, Option<PeerLink>) {
    let (Some(db), Some(records)) = (store.database.clone(), store.proxy_records.clone()) else {
        return (None, None);
    };
    let (view_tx, view_rx) = watch::channel(Arc::new(GateView::default()));
    let (peers_tx, peers_rx) = watch::channel(Vec::new());
    let (issued_tx, issued_rx) = mpsc::unbounded_channel();
    let (lookups_tx, lookups_rx) = mpsc::unbounded_channel();
    let (found_tx, found_rx) = mpsc::unbounded_channel();
    let record_sync = RecordSync {
        records,
        name: settings.replica.name.clone(),
        issued: issued_rx,
        lookups: lookups_rx,
        found: found_tx,
    };
    let sync = GateSync {
        replicas: Replicas::new(db),
        name: settings.replica.name.clone(),
        lease: settings.replica.lease_timeout.as_std(),
        hold_gone: settings.replica.lease_timeout.as_std(),
        view: view_rx,
        peers: peers_tx,
        database,
    };
    let link = PeerLink {
        peers: peers_rx,
        view: view_tx,
        records: RecordLink {
            issued: issued_tx,
            lookups: lookups_tx,
        },
        found: found_rx,
    };
    (Some((sync, record_sync)), Some(link))
}

/// The daemon's long-running parts, before they are spawned.
struct Tasks {
    owner_loop: OwnerLoop,
    sds: SdsServer,
    /// The agent protocol, served beside SDS on its listeners.
    agents: meshca_agent_server::AgentServer,
    heartbeat: Option<Heartbeat>,
    replica_sync: Option<(GateSync, RecordSync)>,
    poll_revocations: bool,
    /// The PKCS#11 token, watched and recovered while the daemon runs.
    token: Option<meshca_hsm::Token>,
    admin_state: admin::AdminState,
}

impl Tasks {
    /// Spawns every part: the owner loop, SDS, the revocations poll (database only), the replica
    /// syncs and the admin API.
    fn spawn(
        self,
        (sds_listeners, workload): (
            BoundListeners,
            Option<(BoundListeners, meshca_workload::WorkloadApi)>,
        ),
        admin_listener: tokio::net::TcpListener,
        reloader: &Reloader,
        shutdown: &CancellationToken,
        limits: ServeLimits,
    ) -> tokio::task::JoinSet<Result<(), TaskError>> {
        let mut tasks = tokio::task::JoinSet::new();
        let owner_loop = self.owner_loop;
        tasks.spawn(async move {
            owner_loop.run().await;
            Ok(())
        });
        if let Some((bound, api)) = workload {
            tasks.spawn(workload_api::serve(
                bound,
                api,
                self.sds.clone(),
                limits.workload.1,
                shutdown.clone(),
            ));
        }
        tasks.spawn(serve_sds(
            sds_listeners,
            self.sds,
            self.agents,
            shutdown.clone(),
        ));
        if self.poll_revocations {
            let poll = reloader.clone().poll_revocations(shutdown.clone());
            tasks.spawn(async move {
                poll.await;
                Ok(())
            });
        }
        if let Some(heartbeat) = self.heartbeat {
            let shutdown = shutdown.clone();
            tasks.spawn(async move {
                heartbeat.run(shutdown).await;
                Ok(())
            });
        }
        if let Some(token) = self.token {
            let watch = super::token_health::watch(token, reloader.clone(), shutdown.clone());
            tasks.spawn(async move {
                watch.await;
                Ok(())
            });
        }
        if let Some((gate_sync, record_sync)) = self.replica_sync {
            let gate_shutdown = shutdown.clone();
            tasks.spawn(async move {
                gate_sync.run(gate_shutdown).await;
                Ok(())
            });
            let shutdown = shutdown.clone();
            tasks.spawn(async move {
                record_sync.run(shutdown).await;
                Ok(())
            });
        }
        tasks.spawn(serve_admin(
            admin_listener,
            self.admin_state,
            limits.admin,
            shutdown.clone(),
        ));
        tasks
    }
}

/// The first world: the resources directory (seeded when empty) with every CA loaded. Invalid
/// resources stop the start with every error listed.
fn load_initial_world(settings: &Settings, keystore: &dyn Keystore) -> Result<World, StartError> {
    ensure_resources(&settings.resources)?;
    let world = load_world(settings, keystore, None, SystemTime::now())
        .map_err(StartError::InvalidResources)?;
    for (mesh, role, ca) in world.authorities() {
        tracing::info!(mesh, ca = %role, id = %ca.ca.id(), "CA loaded");
    }
    Ok(world)
}

/// Binds every SDS listener of the settings.
async fn bind_sds(
    settings: &Settings,
    keystore: &dyn Keystore,
) -> Result<BoundListeners, StartError> {
    let bound = meshca_serve::bind(sds_listeners(settings, keystore)?)
        .await
        .map_err(StartError::SdsListeners)?;
    for addr in bound.local_addrs() {
        tracing::info!(%addr, "SDS listening");
    }
    Ok(bound)
}

/// The SDS listeners of the settings; TCP ones get TLS from `sds.tls` or the daemon's own SDS CA.
fn sds_listeners(
    settings: &Settings,
    keystore: &dyn Keystore,
) -> Result<Vec<Listener>, TlsIdentityError> {
    let mut listeners = Vec::new();
    let mut tls: Option<Arc<rustls::ServerConfig>> = None;
    for addr in &settings.sds.listen {
        let listener = match addr {
            ListenAddr::Unix(path) => Listener::Unix(path.clone()),
            ListenAddr::Tcp(addr) if settings.sds.insecure => Listener::InsecureLoopback(*addr),
            ListenAddr::Tcp(addr) => {
                let config = match &tls {
                    Some(config) => config.clone(),
                    None => tls.insert(server_tls(settings, keystore)?).clone(),
                };
                Listener::Tls {
                    addr: *addr,
                    config,
                }
            }
        };
        listeners.push(listener);
    }
    Ok(listeners)
}

/// The TLS server config of the SDS TCP listeners: `sds.tls` files, or a certificate from the daemon's
/// own SDS CA.
fn server_tls(
    settings: &Settings,
    keystore: &dyn Keystore,
) -> Result<Arc<rustls::ServerConfig>, TlsIdentityError> {
    let identity = match &settings.sds.tls {
        Some(files) => daemon_keys::server_identity_from_files(&files.cert_file, &files.key_file)?,
        None => {
            daemon_keys::server_identity_generated(keystore, &settings.data_dir, SystemTime::now())?
        }
    };
    daemon_keys::server_tls_config(identity)
}

/// Serves SDS, and the agent protocol beside it, on the SDS listeners: agents connect where Envoys do
/// and count toward the same connection limits.
async fn serve_sds(
    bound: BoundListeners,
    sds: SdsServer,
    agents: meshca_agent_server::AgentServer,
    shutdown: CancellationToken,
) -> Result<(), TaskError> {
    let hub = sds.hub().clone();
    let routes = sds.routes().add_service(agents.into_service());
    bound
        .serve_hub(&hub, routes, shutdown)
        .await
        .map_err(TaskError::Sds)
}

async fn serve_admin(
    listener: tokio::net::TcpListener,
    state: admin::AdminState,
    limits: admin::AdminLimits,
    shutdown: CancellationToken,
) -> Result<(), TaskError> {
    admin::serve(listener, state, limits, shutdown)
        .await
        .map_err(TaskError::Admin)
}

/// A start refused for invalid resources is input; any other failed start is not.
impl From<StartError> for crate::Error {
    fn from(error: StartError) -> crate::Error {
        match error {
            StartError::InvalidResources(_) => crate::Error::input(error),
            _ => crate::Error::failed(error),
        }
    }
}
impl From<DaemonError> for crate::Error {
    fn from(error: DaemonError) -> crate::Error {
        crate::Error::failed(error)
    }
}
