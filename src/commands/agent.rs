//! `meshca agent`: the SPIFFE Workload API on this host, fed by meshca servers.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use meshca_agent::{Agent, AgentConfig};
use meshca_config::Settings;
use tokio_util::sync::CancellationToken;

use crate::cli::AgentArgs;
use crate::InvalidInput;

/// The flags given, as settings overrides: (field, flag, value).
fn overrides(args: &AgentArgs) -> Vec<(String, String, String)> {
    let mut overrides = Vec::new();
    let mut add = |field: &str, flag: &str, value: Option<String>| {
        if let Some(value) = value {
            overrides.push((field.to_owned(), flag.to_owned(), value));
        }
    };
    add("agent.servers", "--server", args.server.clone());
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    add("agent.tokenFile", "--token-file", path(&args.token_file));
    add("agent.sdsCa", "--sds-ca", path(&args.sds_ca));
    add("agent.listen", "--listen", args.listen.clone());
    add("agent.admin", "--admin", args.admin.clone());
    overrides
}

/// The agent's configuration from the settings; what is missing or unreadable is the operator's to fix.
fn agent_config(settings: &Settings) -> Result<AgentConfig, InvalidInput> {
    let agent = &settings.agent;
    if agent.servers.is_empty() {
        return Err(InvalidInput(
            "agent.servers: no meshca server named; give --server ADDR[,ADDR...], agent.servers in the \
             settings file, or MESHCA_AGENT_SERVERS"
                .into(),
        ));
    }
    let Some(token_file) = agent.token_file.clone() else {
        return Err(InvalidInput(
            "agent.tokenFile: no agent token; give --token-file FILE, agent.tokenFile in the settings \
             file, or MESHCA_AGENT_TOKEN_FILE (mint one with `meshca token --type agent --name HOST`)"
                .into(),
        ));
    };
    let sds_ca = match &agent.sds_ca {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            InvalidInput(format!("agent.sdsCa: cannot read {}: {e}", path.display()))
        })?),
        None => None,
    };
    let mut config = AgentConfig::new(agent.servers.clone(), token_file);
    config.sds_ca = sds_ca;
    config.listen = agent.listen.clone();
    config.admin = Some(agent.admin);
    config.workload.ack_after = settings.workload_api.ack_after.as_std();
    let to_usize = |v: u32| usize::try_from(v).unwrap_or(usize::MAX);
    let limits = &settings.limits;
    config.workload.streams_per_caller = to_usize(limits.workload_streams_per_caller);
    config.workload.connections_per_uid = to_usize(limits.workload_connections_per_uid);
    config.workload.request_bytes = to_usize(limits.workload_request_bytes);
    config.workload.warnings_per_minute = limits.warnings_per_minute;
    Ok(config)
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load_with_overrides(
        args.config.config.as_deref(),
        meshca_daemon::process_env(),
        overrides(&args),
    )
    .map_err(|e| InvalidInput(e.to_string()))?;
    let config = agent_config(&settings)?;
    // Handled from before the start: a SIGTERM sent as soon as the agent is up waits for it to take
    // it, where the default action would kill it without stopping its streams.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let shutdown = CancellationToken::new();
    let agent = Agent::start(
        config,
        meshca_sds::SdsServer::attested_routes_on,
        shutdown.clone(),
    )
    .await
    .map_err(|e| {
        if e.is_invalid_input() {
            anyhow::Error::new(InvalidInput(e.to_string()))
        } else {
            anyhow::Error::new(e)
        }
    })?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
    shutdown.cancel();
    agent.wait().await;
    Ok(ExitCode::SUCCESS)
}
