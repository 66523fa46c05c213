//! One module per subcommand; `run` dispatches.

mod agent;
mod bench;
mod bootstrap;
mod bundle;
#[cfg(feature = "drills")]
mod drill;
mod generated;
mod inspect;
mod issue;
mod sds_fetch;
mod status;
mod token;
mod validate;
mod workload_fetch;

use std::path::Path;
use std::process::ExitCode;

use meshca_config::Settings;

use crate::cli::Command;

/// Runs one subcommand.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => {
            let settings = load_settings(args.config.as_deref())?;
            meshca_daemon::run(settings, args.config.clone()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate(args) => validate::run(args),
        Command::Token(args) => token::run(args),
        Command::Issue(args) => issue::run(args).await,
        Command::Sds(crate::cli::SdsCommand::Fetch(args)) => sds_fetch::run(args).await,
        Command::Inspect(args) => inspect::run(args),
        Command::Status(args) => status::run(args).await,
        Command::Bench(crate::cli::BenchCommand::Issuance(args)) => bench::issuance(args),
        #[cfg(feature = "drills")]
        Command::Bench(crate::cli::BenchCommand::Sds(args)) => bench::sds(args).await,
        #[cfg(feature = "drills")]
        Command::Bench(crate::cli::BenchCommand::Workload(args)) => bench::workload(args).await,
        #[cfg(feature = "drills")]
        Command::Bench(crate::cli::BenchCommand::Agents(args)) => bench::agents(args).await,
        #[cfg(feature = "drills")]
        Command::Bench(crate::cli::BenchCommand::Federation(args)) => bench::federation(args).await,
        #[cfg(feature = "drills")]
        Command::Bench(crate::cli::BenchCommand::SdsClient) => {
            meshca_drill::bench::child::serve().await
        }
        #[cfg(feature = "drills")]
        Command::Drill(args) => drill::run(args).await,
        #[cfg(not(feature = "drills"))]
        Command::Bench(_) | Command::Drill(_) => Err(crate::InvalidInput(
            "this meshca was built without drills and benches (the `drills` cargo feature, off in \
             packaged builds); run them from a build of the source (`cargo run --release -- drill ...`)"
                .to_owned(),
        )
        .into()),
        Command::Bootstrap(args) => bootstrap::run(args),
        Command::Workload(crate::cli::WorkloadCommand::Fetch(args)) => {
            workload_fetch::run(args).await
        }
        Command::Agent(args) => agent::run(args).await,
        Command::Bundle(crate::cli::BundleCommand::Fetch(args)) => bundle::fetch(args).await,
        Command::Bundle(crate::cli::BundleCommand::Show(args)) => bundle::show(args).await,
        Command::Completions(args) => generated::completions(args),
        Command::Manpages(args) => generated::manpages(args),
    }
}

/// Settings from embedded defaults, the file and `MESHCA_*` variables; invalid settings exit 2.
pub fn load_settings(path: Option<&Path>) -> anyhow::Result<Settings> {
    Ok(meshca_daemon::load_settings(path)?)
}

/// A signed number of seconds as people read a time left: `2d11h`, `5h3m`, `4m10s`, `-1d2h` once past.
pub fn human_duration(secs: i64) -> String {
    let (sign, secs) = if secs < 0 { ("-", -secs) } else { ("", secs) };
    let (d, h, m) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60);
    if d > 0 {
        format!("{sign}{d}d{h}h")
    } else if h > 0 {
        format!("{sign}{h}h{m}m")
    } else {
        format!("{sign}{m}m{}s", secs % 60)
    }
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
