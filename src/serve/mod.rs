//! `meshca serve`: wiring the owner, the SDS server, the admin API, the resource watcher and signals.

pub mod admin;
pub mod bundles;
pub mod daemon_keys;
pub mod metrics;
pub mod owner;
pub mod plan;
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

/// Reads and validates the resources directory and loads every CA it needs.
pub fn load_world(
    settings: &Settings,
    keystore: &dyn Keystore,
    previous: Option<&World>,
    now: SystemTime,
) -> Result<World, Vec<UpdateError>> {
    let resources = meshca_config::load_dir(&settings.resources)
        .map_err(|errors| errors.iter().map(UpdateError::from).collect::<Vec<_>>())?;
    World::load(
        resources,
        &CaSource {
            keystore,
            settings,
            previous,
            now,
        },
    )
}

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let keystore: Arc<dyn Keystore> = Arc::new(open_keystore(&settings)?);
    ensure_resources(&settings.resources)?;
    let world =
        load_world(&settings, keystore.as_ref(), None, SystemTime::now()).map_err(|errors| {
            let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            anyhow::Error::new(InvalidInput(format!(
                "the resources are invalid; nothing was started:\n  {}",
                lines.join("\n  ")
            )))
        })?;
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

    let mut listeners = Vec::new();
    let mut tls: Option<Arc<rustls::ServerConfig>> = None;
    for addr in &settings.sds.listen {
        match addr {
            ListenAddr::Unix(path) => listeners.push(Listener::Unix(path.clone())),
            ListenAddr::Tcp(addr) if settings.sds.insecure => {
                listeners.push(Listener::InsecureLoopback(*addr))
            }
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
                                keystore.as_ref(),
                                &settings.data_dir,
                                SystemTime::now(),
                            )?,
                        };
                        let c = daemon_keys::server_tls_config(identity)?;
                        tls = Some(c.clone());
                        c
                    }
                };
                listeners.push(Listener::Tls {
                    addr: *addr,
                    config,
                });
            }
        }
    }
    let bound = meshca_sds::bind(listeners)
        .await
        .context("cannot start the SDS listeners (sds.listen)")?;
    for addr in bound.local_addrs() {
        tracing::info!(%addr, "SDS listening");
    }
    let admin_listener = admin::bind(settings.admin.listen).await?;
    tracing::info!(addr = %settings.admin.listen, "admin API listening");

    let shutdown = CancellationToken::new();
    let ready = Arc::new(AtomicBool::new(false));
    let (reload_tx, reload_rx) = mpsc::channel::<watcher::Change>(16);
    let _watcher = watcher::watch(&settings.resources, &revocations_path, reload_tx.clone())?;

    let owner = Owner::new(&settings, world, metrics.clone(), snapshot_tx, status_tx);
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
            status: status_rx,
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

    let result = wait_for_signals(reload_tx, &shutdown, &mut tasks).await;
    shutdown.cancel();
    if tokio::time::timeout(GRACE, async { while tasks.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        tracing::warn!(grace = ?GRACE, "tasks still running after the grace period; exiting anyway");
    }
    result
}

/// Waits for SIGTERM/SIGINT (clean exit), forwards SIGHUP as a reload, and returns early if a task fails.
async fn wait_for_signals(
    reload: mpsc::Sender<watcher::Change>,
    shutdown: &CancellationToken,
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
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
                let _ = reload.try_send(watcher::Change::All);
            }
            _ = shutdown.cancelled() => return Ok(()),
            Some(done) = tasks.join_next() => {
                return match done {
                    Ok(Ok(())) => Err(anyhow!("a daemon task ended unexpectedly")),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(anyhow!("a daemon task panicked: {e}")),
                };
            }
        }
    }
}

/// The owner's loop: events, reloads and renewals, each followed by one reconcile.
#[allow(clippy::too_many_arguments)]
async fn run_owner(
    mut owner: Owner,
    mut events: mpsc::UnboundedReceiver<StreamEvent>,
    mut reloads: mpsc::Receiver<watcher::Change>,
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
            change = reloads.recv() => {
                let Some(mut change) = change else { return Ok(()) };
                while let Ok(more) = reloads.try_recv() {
                    change = change.merge(more);
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
                    match loaded {
                        Ok(world) => {
                            tracing::info!("resource update applied");
                            owner.accept(world);
                        }
                        Err(errors) => owner.reject(errors, now),
                    }
                    dirty = true;
                }
            }
            _ = tokio::time::sleep(wait) => dirty = true,
        }
        if dirty {
            next_renewal = tokio::task::block_in_place(|| owner.reconcile(SystemTime::now()));
        }
    }
}
