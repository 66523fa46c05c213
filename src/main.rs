//! meshca: a certificate authority and SDS identity issuer for service meshes.
#![forbid(unsafe_code)]

mod allocator;
mod cli;
mod commands;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, LogFormat};

/// Invalid input from the user (settings, resources, arguments): exit code 2.
#[derive(Debug)]
pub struct InvalidInput(pub String);

impl std::fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidInput {}

/// The exit code of a failed command: 2 for input the user must fix (the command's own checks or
/// the daemon library's), 1 for anything else.
fn exit_code(error: &anyhow::Error) -> ExitCode {
    let invalid = error.downcast_ref::<InvalidInput>().is_some()
        || error
            .downcast_ref::<meshca_daemon::Error>()
            .is_some_and(meshca_daemon::Error::is_invalid_input);
    ExitCode::from(if invalid { 2 } else { 1 })
}

/// Logs to stderr at `RUST_LOG` (default `info`); the HTTP libraries' own warnings, which any peer
/// can cause, go through the daemon's per-minute budget ([`meshca_serve::library_logs`]).
fn init_logging(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or the journal gets plain text.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let budget = LibraryBudget;
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer.with_filter(budget).boxed(),
        LogFormat::Json => layer.json().with_filter(budget).boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .init();
}

/// Passes the HTTP libraries' warnings through [`meshca_serve::library_logs`], per event.
struct LibraryBudget;

impl<S> tracing_subscriber::layer::Filter<S> for LibraryBudget {
    fn enabled(
        &self,
        metadata: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        meshca_serve::library_logs::admit(metadata)
    }

    fn callsite_enabled(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if meshca_serve::library_logs::budgeted(metadata) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::always()
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}
