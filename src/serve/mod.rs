//! `meshca serve`: wiring the owner loop, the SDS server, the admin API, the resource watcher and
//! signals. The decisions themselves live in `meshca-control`.

pub mod admin;
mod daemon;
pub mod daemon_keys;
mod data_dir;
mod files;
mod limits;
pub mod metrics;
mod reload;
pub mod revocations;
mod watcher;

pub use daemon::{Daemon, DaemonOptions};
pub use data_dir::DataDir;
pub use files::{open_keystore, token_signing_key};
use reload::Change;

use meshca_config::Settings;

/// Runs the daemon until SIGTERM/SIGINT.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let mut daemon = Daemon::start(settings, DaemonOptions::default()).await?;
    let result = wait_for_signals(&mut daemon).await;
    daemon.stop().await;
    result
}

/// Waits for SIGTERM/SIGINT (clean exit), applies SIGHUP as a reload, and returns early if a task
/// fails.
async fn wait_for_signals(daemon: &mut Daemon) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let reloader = daemon.reloader();
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); return Ok(()) }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); return Ok(()) }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading resources and revocations");
                reloader.try_apply(Change::All);
            }
            result = daemon.wait() => return result,
        }
    }
}
