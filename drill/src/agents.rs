//! The `meshca agent`s of `drill workload --agent`: real agents, in the drill's process, each with a
//! Workload API socket of its own in the sandbox and a token naming it. The drill's workloads connect
//! to their agent's socket; their keys are made by the agent, and the agent acknowledges a state to
//! its server only once every workload stream on its socket was sent it, so the daemon's ordering gate
//! counts the workloads behind each agent as it counts SDS streams.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use meshca_agent::{Agent, AgentConfig, ServerAddr};
use tokio_util::sync::CancellationToken;

use super::scenario::agent_name;

/// The agents' token lifetime: longer than any drill.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Running agents.
#[derive(Debug)]
pub struct Agents {
    agents: Vec<Agent>,
    /// The server each agent tries first, as its status names servers.
    first_servers: Vec<String>,
    shutdown: CancellationToken,
}

impl Agents {
    /// Starts `count` agents in `dir`: agent `i` is [`agent_name`]`(i)`, serves `dir/agent-<i>.sock`,
    /// and tries the servers `servers(i)` (unix socket paths) in order; `configure` has the last word
    /// on each one's configuration.
    pub async fn start(
        dir: &Path,
        count: usize,
        servers: impl Fn(usize) -> Vec<PathBuf>,
        mint: &dyn Fn(&meshca_auth::Claims) -> anyhow::Result<String>,
        configure: &dyn Fn(&mut AgentConfig),
    ) -> anyhow::Result<Agents> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_secs();
        let shutdown = CancellationToken::new();
        let mut agents = Vec::with_capacity(count);
        let mut first_servers = Vec::with_capacity(count);
        for index in 0..count {
            let name = agent_name(index);
            let claims = meshca_auth::Claims::new_agent(&name, TOKEN_LIFETIME, now)
                .with_context(|| format!("agent {name}: cannot make token claims"))?;
            let token_file = dir.join(format!("agent-{index}.token"));
            write_private(&token_file, &mint(&claims)?)?;
            let servers: Vec<ServerAddr> =
                servers(index).into_iter().map(ServerAddr::Unix).collect();
            first_servers.push(servers.first().map(ToString::to_string).unwrap_or_default());
            let mut config = AgentConfig::new(servers, token_file);
            config.listen = dir.join(format!("agent-{index}.sock"));
            config.admin = None;
            // A killed replica's agent moves to the next one at once.
            config.backoff = (Duration::from_millis(50), Duration::from_millis(500));
            configure(&mut config);
            tracing::info!(agent = %name, socket = %config.listen.display(), "drill: starting an agent");
            let agent = Agent::start(
                config,
                meshca_sds::SdsServer::attested_routes_on,
                shutdown.child_token(),
            )
            .await
            .map_err(|e| anyhow!("agent {name} did not start: {e}"))?;
            agents.push(agent);
        }
        Ok(Agents {
            agents,
            first_servers,
            shutdown,
        })
    }

    /// The agents' Workload API sockets, in order.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.agents
            .iter()
            .map(|a| a.socket().to_path_buf())
            .collect()
    }

    /// How many agents are connected to another server than the one they tried first (moved there
    /// when theirs stopped answering).
    pub fn moved(&self) -> u64 {
        let moved = self
            .agents
            .iter()
            .zip(&self.first_servers)
            .filter(|(agent, first)| {
                agent
                    .status()
                    .get()
                    .server
                    .connected
                    .is_some_and(|now| now != **first)
            })
            .count();
        moved as u64
    }

    /// Stops every agent and waits for them.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for agent in self.agents {
            agent.wait().await;
        }
    }
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
