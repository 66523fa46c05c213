//! `meshca serve` in the foreground: the daemon under the process's signals (SIGTERM and SIGINT drain and
//! stop it, SIGHUP reloads), and the settings it starts from.

use crate::reload::Change;
use crate::{Daemon, DaemonOptions, Result};

use std::path::{Path, PathBuf};

use meshca_config::{Settings, SettingsError};

/// Settings that do not load (the file, or the environment): input the operator must fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidSettings(SettingsError);

/// A handler for the process's signals could not be installed.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct SignalError(std::io::Error);

/// Runs the daemon (with `settings`, read from `config` and the environment) until SIGTERM/SIGINT.
pub async fn run(settings: Settings, config: Option<PathBuf>) -> Result<()> {
    // Handled from before the start: a SIGTERM sent as soon as `/ready` answers (by systemd, a
    // supervisor, a test) waits for the daemon to take it, where the default action would kill it
    // without draining.
    let signals = Signals::install()?;
    let mut daemon = Daemon::start(settings.clone(), DaemonOptions::default()).await?;
    let result = wait_for_signals(signals, &mut daemon, settings, config).await;
    daemon.stop().await;
    result
}

/// The process's signals the daemon handles, each queued from its installation until read.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::result::Result<Signals, SignalError> {
        use tokio::signal::unix::{signal, SignalKind};
        let handler = |kind| signal(kind).map_err(SignalError);
        Ok(Signals {
            term: handler(SignalKind::terminate())?,
            int: handler(SignalKind::interrupt())?,
            hup: handler(SignalKind::hangup())?,
        })
    }
}

/// Waits for SIGTERM/SIGINT (clean exit), applies SIGHUP as a reload, and returns early if a task
/// fails.
async fn wait_for_signals(
    Signals {
        mut term,
        mut int,
        mut hup,
    }: Signals,
    daemon: &mut Daemon,
    mut settings: Settings,
    config: Option<PathBuf>,
) -> Result<()> {
    let reloader = daemon.reloader();
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); return Ok(()) }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); return Ok(()) }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading defaults.mesh, resources and revocations, and fetching every federation peer's bundle");
                let default_mesh = reread_default_mesh(config.as_deref(), &mut settings);
                reloader.try_apply_with(Change::All, default_mesh);
                daemon.federation.refresh_all();
            }
            result = daemon.wait() => return result,
        }
    }
}

/// Reads the settings again (file and environment) for SIGHUP: returns the new `defaults.mesh` if it
/// changed, the one setting applied while serving. Other changes are reported as waiting for a restart;
/// settings that do not load change nothing.
fn reread_default_mesh(config: Option<&Path>, current: &mut Settings) -> Option<Option<String>> {
    let new = match load_settings(config) {
        Ok(new) => new,
        Err(error) => {
            tracing::error!("settings not reloaded, the running ones stay: {error:#}");
            return None;
        }
    };
    let others_changed = Settings {
        defaults: current.defaults.clone(),
        ..new.clone()
    } != *current;
    if others_changed {
        tracing::warn!(
            "settings other than defaults.mesh changed; they take effect when meshca restarts"
        );
    }
    if new.defaults == current.defaults {
        return None;
    }
    current.defaults = new.defaults.clone();
    Some(new.defaults.mesh)
}

/// Settings from embedded defaults, the file and `MESHCA_*` variables; invalid settings are an
/// [`crate::Error::InvalidInput`].
pub fn load_settings(path: Option<&Path>) -> Result<Settings> {
    Ok(Settings::load(path, process_env()).map_err(InvalidSettings)?)
}

/// The process environment, skipping variables that are not UTF-8 (never meshca's own).
pub fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}

/// Settings that do not load: input.
impl From<InvalidSettings> for crate::Error {
    fn from(error: InvalidSettings) -> crate::Error {
        crate::Error::input(error)
    }
}
impl From<SignalError> for crate::Error {
    fn from(error: SignalError) -> crate::Error {
        crate::Error::failed(error)
    }
}
