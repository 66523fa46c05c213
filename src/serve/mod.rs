//! `meshca serve`: wiring the owner, the SDS server, the admin API, the resource watcher and signals.

pub mod admin;
pub mod bundles;
pub mod daemon_keys;
pub mod generations;
pub mod metrics;
pub mod owner;
pub mod plan;
pub mod rollout;
pub mod status;
#[cfg(test)]
mod tests;
pub mod watcher;
pub mod world;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context};
use meshca_auth::RevocationList;
use meshca_config::{ListenAddr, Settings};
use meshca_keystore::{FileKeystore, Keystore};
use meshca_sds::{Listener, SdsServer, ServerOptions, Snapshot, StreamEvent};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::InvalidInput;
use owner::Owner;
use world::{CaSource, UpdateError, World};

/// How long shutdown waits for streams and tasks to finish.
const GRACE: Duration = Duration::from_secs(10);

/// The keystore of a data directory.
pub fn open_keystore(settings: &Settings) -> anyhow::Result<FileKeystore> {
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("dataDir: cannot create {}", settings.data_dir.display()))?;
    FileKeystore::open(&settings.data_dir.join("keystore")).with_context(|| {
        format!(
            "dataDir: cannot open the keystore in {}",
            settings.data_dir.display()
        )
    })
}

/// The revocation list file: one revoked token id per line.
pub fn revocations_file(settings: &Settings) -> PathBuf {
    settings.data_dir.join("revoked-tokens")
}

/// Reads the revocation list; a missing file is an empty list.
pub fn read_revocations(path: &Path) -> anyhow::Result<RevocationList> {
    match std::fs::read_to_string(path) {
        Ok(text) => RevocationList::parse(&text).map_err(|e| {
            anyhow!(
                "the token revocation list {} is invalid: {e}",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RevocationList::default()),
        Err(e) => Err(anyhow!(
            "cannot read the token revocation list {}: {e}",
            path.display()
        )),
    }
}

/// Creates the resources directory with the default Mesh and MeshIdentity when it holds no resource file.
pub fn ensure_resources(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("resources: cannot create {}", dir.display()))?;
    let has_yaml = std::fs::read_dir(dir)
        .with_context(|| format!("resources: cannot read {}", dir.display()))?
        .filter_map(Result::ok)
        .any(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml")
        });
    if !has_yaml {
        let path = dir.join("default.yaml");
        std::fs::write(&path, meshca_config::default_resources_yaml())
            .with_context(|| format!("cannot write {}", path.display()))?;
        tracing::info!(file = %path.display(), "resources directory was empty: wrote the default Mesh and MeshIdentity");
    }
    Ok(())
}

/// Reads and validates the resources directory and loads every CA it needs. Every error of every stage is
/// reported at once: CA and template checks run on whatever parsed, even when other files did not.
pub fn load_world(
    settings: &Settings,
    keystore: &dyn Keystore,
    previous: Option<&World>,
    now: SystemTime,
) -> Result<World, Vec<UpdateError>> {
    let (resources, errors) = meshca_config::load_dir_lenient(&settings.resources);
    check_world(
        resources,
        errors,
        &CaSource {
            keystore,
            settings,
            previous,
            now,
        },
    )
}

/// Builds the world from `resources` unless `errors` (from parsing them) or the world's own checks found
/// anything; returns all of those errors together.
pub fn check_world(
    resources: meshca_config::Resources,
    errors: Vec<meshca_config::ResourceError>,
    src: &CaSource<'_>,
) -> Result<World, Vec<UpdateError>> {
    let mut errors: Vec<UpdateError> = errors.iter().map(UpdateError::from).collect();
    match World::load(resources, src) {
        Ok(world) if errors.is_empty() => Ok(world),
        Ok(_) => Err(errors),
        Err(mut more) => {
            errors.append(&mut more);
            Err(errors)
        }
    }
}

/// Options of an in-process daemon that no settings file can set.
#[derive(Clone, Copy, Debug)]
pub struct DaemonOptions {
    /// The ordering gate of DESIGN §8. Only drills turn it off, to show what it prevents.
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

/// A reload request for the owner; `done` hears whether the update was accepted.
#[derive(Debug)]
pub struct Reload {
    /// What to reload.
    pub change: watcher::Change,
    /// Told the outcome once the update is applied or rejected.
    pub done: Option<tokio::sync::oneshot::Sender<Result<(), Vec<UpdateError>>>>,
}

/// A running daemon: its listeners, its status, and the handles to reload and stop it.
pub struct Daemon {
    /// Where SDS listens (real ports when 0 was asked).
    pub sds_addrs: Vec<meshca_sds::BoundAddr>,
    /// Where the admin API listens.
    pub admin_addr: std::net::SocketAddr,
    /// The owner's latest status.
    pub status: watch::Receiver<Arc<status::Status>>,
    signing_key: meshca_auth::SigningKey,
    reload: mpsc::Sender<Reload>,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<anyhow::Result<()>>,
    _watcher: Option<notify::RecommendedWatcher>,
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
    /// Loads everything, binds every listener and starts serving. Invalid resources are an
    /// [`InvalidInput`] error; nothing is started then.
    pub async fn start(settings: Settings, options: DaemonOptions) -> anyhow::Result<Daemon> {
        let keystore: Arc<dyn Keystore> = Arc::new(open_keystore(&settings)?);
        ensure_resources(&settings.resources)?;
        let world = load_world(&settings, keystore.as_ref(), None, SystemTime::now()).map_err(
            |errors| {
                let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                anyhow::Error::new(InvalidInput(format!(
                    "the resources are invalid; nothing was started:\n  {}",
                    lines.join("\n  ")
                )))
            },
        )?;
        for (mesh, role, ca) in world.authorities() {
            tracing::info!(mesh, ca = %role, id = %ca.ca.id(), "CA loaded");
        }

        let signing_key = daemon_keys::token_signing_key(keystore.as_ref())?;
        let revocations_path = revocations_file(&settings);
        let (revocations_tx, revocations_rx) =
            watch::channel(Arc::new(read_revocations(&revocations_path)?));

        let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(Snapshot::empty()));
        let (status_tx, status_rx) = watch::channel(Arc::new(status::Status::default()));
        let (events_tx, events_rx) = mpsc::unbounded_channel::<StreamEvent>();
        let sds = SdsServer::new(
            snapshot_rx,
            signing_key.verifier(),
            revocations_rx,
            events_tx,
            ServerOptions::default(),
        );
        let registry = sds.registry();
        let metrics = Arc::new(metrics::Metrics::new(sds.metrics()));

        let listeners = sds_listeners(&settings, keystore.as_ref())?;
        let bound = meshca_sds::bind(listeners)
            .await
            .context("cannot start the SDS listeners (sds.listen)")?;
        let sds_addrs = bound.local_addrs();
        for addr in &sds_addrs {
            tracing::info!(%addr, "SDS listening");
        }
        let admin_listener = admin::bind(settings.admin.listen).await?;
        let admin_addr = admin_listener.local_addr()?;
        tracing::info!(addr = %admin_addr, "admin API listening");

        let shutdown = CancellationToken::new();
        let ready = Arc::new(AtomicBool::new(false));
        let (reload_tx, reload_rx) = mpsc::channel::<Reload>(16);
        let watcher = if options.watch_files {
            Some(watcher::watch(
                &settings.resources,
                &revocations_path,
                reload_tx.clone(),
            )?)
        } else {
            None
        };

        let owner = Owner::new(&settings, world, metrics.clone(), snapshot_tx, status_tx)
            .with_gate(options.gate, Arc::new(registry.clone()));
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(run_owner(
            owner,
            events_rx,
            reload_rx,
            settings.clone(),
            keystore.clone(),
            revocations_tx,
            revocations_path,
            shutdown.clone(),
        ));
        tasks.spawn({
            let shutdown = shutdown.clone();
            async move {
                bound
                    .serve(sds, shutdown)
                    .await
                    .map_err(|e| anyhow!("SDS server failed: {e}"))
            }
        });
        tasks.spawn({
            let state = admin::AdminState {
                status: status_rx.clone(),
                streams: registry,
                metrics,
                ready: ready.clone(),
            };
            let shutdown = shutdown.clone();
            async move {
                admin::serve(admin_listener, state, shutdown)
                    .await
                    .map_err(|e| anyhow!("admin API failed: {e}"))
            }
        });
        ready.store(true, Ordering::Release);
        tracing::info!("meshca is ready");
        Ok(Daemon {
            sds_addrs,
            admin_addr,
            status: status_rx,
            signing_key,
            reload: reload_tx,
            shutdown,
            tasks,
            _watcher: watcher,
        })
    }

    /// The unix socket SDS listens on, as a client target (`unix:///path`), if any.
    pub fn unix_target(&self) -> Option<String> {
        self.sds_addrs.iter().find_map(|a| match a {
            meshca_sds::BoundAddr::Unix(p) => Some(format!("unix://{}", p.display())),
            _ => None,
        })
    }

    /// Mints a proxy token with the daemon's key.
    pub fn mint_token(&self, claims: &meshca_auth::Claims) -> anyhow::Result<String> {
        self.signing_key
            .mint(claims)
            .map_err(|e| anyhow!("cannot sign a token: {e}"))
    }

    /// Reloads the resources directory now and waits for the outcome.
    pub async fn reload_resources(&self) -> anyhow::Result<Result<(), Vec<UpdateError>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let request = Reload {
            change: watcher::Change::Resources,
            done: Some(tx),
        };
        self.reload
            .send(request)
            .await
            .map_err(|_| anyhow!("the daemon has stopped"))?;
        rx.await
            .map_err(|_| anyhow!("the daemon stopped before applying the update"))
    }

    /// A sender for reload requests (SIGHUP uses it).
    pub fn reloader(&self) -> mpsc::Sender<Reload> {
        self.reload.clone()
    }

    /// Waits until a daemon task fails (or ends, which is a failure too) or `shutdown` is cancelled.
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        tokio::select! {
            _ = self.shutdown.cancelled() => Ok(()),
            done = self.tasks.join_next() => match done {
                None => Ok(()),
                Some(Ok(Ok(()))) => Err(anyhow!("a daemon task ended unexpectedly")),
                Some(Ok(Err(e))) => Err(e),
                Some(Err(e)) => Err(anyhow!("a daemon task panicked: {e}")),
            },
        }
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

/// The SDS listeners of the settings; TCP ones get TLS from `sds.tls` or the daemon's own SDS CA.
fn sds_listeners(settings: &Settings, keystore: &dyn Keystore) -> anyhow::Result<Vec<Listener>> {
    let mut listeners = Vec::new();
    let mut tls: Option<Arc<rustls::ServerConfig>> = None;
    for addr in &settings.sds.listen {
        let listener = match addr {
            ListenAddr::Unix(path) => Listener::Unix(path.clone()),
            ListenAddr::Tcp(addr) if settings.sds.insecure => Listener::InsecureLoopback(*addr),
            ListenAddr::Tcp(addr) => {
                let config = match &tls {
                    Some(c) => c.clone(),
                    None => {
                        let identity = match &settings.sds.tls {
                            Some(files) => daemon_keys::server_identity_from_files(
                                &files.cert_file,
                                &files.key_file,
                            )?,
                            None => daemon_keys::server_identity_generated(
                                keystore,
                                &settings.data_dir,
                                SystemTime::now(),
                            )?,
                        };
                        let c = daemon_keys::server_tls_config(identity)?;
                        tls = Some(c.clone());
                        c
                    }
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

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let mut daemon = Daemon::start(settings, DaemonOptions::default()).await?;
    let result = wait_for_signals(daemon.reloader(), &mut daemon).await;
    daemon.stop().await;
    result
}

/// Waits for SIGTERM/SIGINT (clean exit), forwards SIGHUP as a reload, and returns early if a task fails.
async fn wait_for_signals(reload: mpsc::Sender<Reload>, daemon: &mut Daemon) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); return Ok(()) }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); return Ok(()) }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading resources and revocations");
                let _ = reload.try_send(Reload { change: watcher::Change::All, done: None });
            }
            result = daemon.wait() => return result,
        }
    }
}

/// Re-evaluates the serving resources at `now`: builtin CAs whose successor is due get it (DESIGN §8 orders
/// its rollout like any new CA).
pub fn rotate_cas(
    owner: &mut Owner,
    settings: &Settings,
    keystore: &dyn Keystore,
    now: SystemTime,
) {
    let resources = (*owner.world().resources).clone();
    let src = CaSource {
        keystore,
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

/// The owner's loop: events, reloads and renewals, each followed by one reconcile.
#[allow(clippy::too_many_arguments)]
async fn run_owner(
    mut owner: Owner,
    mut events: mpsc::UnboundedReceiver<StreamEvent>,
    mut reloads: mpsc::Receiver<Reload>,
    settings: Settings,
    keystore: Arc<dyn Keystore>,
    revocations_tx: watch::Sender<Arc<RevocationList>>,
    revocations_path: PathBuf,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut next_renewal = tokio::task::block_in_place(|| owner.reconcile(SystemTime::now()));
    loop {
        let wait = next_renewal
            .map(|t| t.duration_since(SystemTime::now()).unwrap_or_default())
            .unwrap_or(Duration::from_secs(3600));
        let mut dirty = false;
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            event = events.recv() => {
                let Some(event) = event else { return Ok(()) };
                dirty |= owner.on_event(event);
                while let Ok(event) = events.try_recv() {
                    dirty |= owner.on_event(event);
                }
            }
            request = reloads.recv() => {
                let Some(first) = request else { return Ok(()) };
                let mut change = first.change;
                let mut waiting: Vec<_> = first.done.into_iter().collect();
                while let Ok(more) = reloads.try_recv() {
                    change = change.merge(more.change);
                    waiting.extend(more.done);
                }
                if change.revocations() {
                    match read_revocations(&revocations_path) {
                        Ok(list) => { revocations_tx.send_replace(Arc::new(list)); }
                        Err(e) => tracing::error!("revocation list not reloaded, the previous one stays in force: {e}"),
                    }
                }
                if change.resources() {
                    let now = SystemTime::now();
                    let loaded = tokio::task::block_in_place(|| load_world(&settings, keystore.as_ref(), Some(owner.world()), now));
                    let outcome = match loaded {
                        Ok(world) => {
                            tracing::info!("resource update applied");
                            owner.accept(world);
                            Ok(())
                        }
                        Err(errors) => {
                            owner.reject(errors.clone(), now);
                            Err(errors)
                        }
                    };
                    // Reconcile before answering, so a caller that waited sees the update served.
                    next_renewal = tokio::task::block_in_place(|| owner.reconcile(SystemTime::now()));
                    for done in waiting.drain(..) {
                        let _ = done.send(outcome.clone());
                    }
                    continue;
                }
                for done in waiting {
                    let _ = done.send(Ok(()));
                }
            }
            _ = tokio::time::sleep(wait) => {
                dirty = true;
                let now = SystemTime::now();
                if owner.world().next_rotation_event().is_some_and(|t| t <= now) {
                    tokio::task::block_in_place(|| rotate_cas(&mut owner, &settings, keystore.as_ref(), now));
                }
            }
        }
        if dirty {
            next_renewal = tokio::task::block_in_place(|| owner.reconcile(SystemTime::now()));
        }
    }
}
