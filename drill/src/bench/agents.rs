//! `meshca bench agents` (BENCHMARKS.md): many `meshca agent`s against one server. An in-process daemon
//! serves mesh `default` from builtin CA ca-1, with N agents each named by R WorkloadRegistrations (each
//! on its own Dataplane); N simulated agents ([`super::agent_stream`]), one connection each, open their
//! `Sync` streams, get their registrations certified over keys they made, and idle while the daemon's
//! memory is read; then the mesh is switched to ca-2 (ca-1 kept as secondary), and per agent the bench
//! times the first state whose bundle holds ca-2, and the first whose every certificate ca-2 issued.
//!
//! The simulated agents acknowledge each state at once, as an agent with no Workload API stream open
//! does; what a real agent adds per workload stream is measured by `bench workload --agent`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use meshca_daemon::Error;

use super::fleet::agent_stream::AgentPlan;
use super::fleet::{FleetPlan, Streams};
use super::harness::{self, mesh_yaml, BenchClient, RunOptions, MESH};
use crate::sandbox::Sandbox;
use crate::scenario::registered_workload;

/// What `meshca bench agents` is asked for, before it is checked.
#[derive(Clone, Debug)]
pub struct AgentsArgs {
    /// How many agents.
    pub agents: usize,
    /// How many registrations name each agent.
    pub registrations: usize,
    /// How long the agents stay idle before the memory is read, in seconds.
    pub seconds: f64,
    /// How long the setup, and then the rotation, may take, in seconds.
    pub timeout: f64,
    /// Where the agents run.
    pub client: BenchClient,
}

impl Default for AgentsArgs {
    /// The defaults of `meshca bench agents`.
    fn default() -> AgentsArgs {
        AgentsArgs {
            agents: 1_000,
            registrations: 1,
            seconds: 2.0,
            timeout: 120.0,
            client: BenchClient::Process,
        }
    }
}

/// The most registrations the bench writes (each a Dataplane the daemon certifies).
const MAX_REGISTRATIONS: usize = 100_000;

/// What to measure, checked.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Registrations per agent.
    pub registrations: usize,
    /// How it runs: one stream, and one connection, per agent.
    pub run: RunOptions,
}

impl Options {
    fn from_args(args: &AgentsArgs) -> Result<Options, Error> {
        let total = args.agents.saturating_mul(args.registrations);
        if args.agents == 0 || args.registrations == 0 || total > MAX_REGISTRATIONS {
            return Err(Error::invalid_input(format!(
                "--agents and --registrations must be at least 1, and name at most {MAX_REGISTRATIONS} registrations in all (got {} × {})",
                args.agents, args.registrations
            )));
        }
        Ok(Options {
            registrations: args.registrations,
            run: RunOptions::new(
                (args.agents, Some(args.agents), args.agents),
                (args.seconds, args.timeout),
                args.client,
            )?,
        })
    }
}

/// The name of agent `index`.
fn agent(index: usize) -> String {
    format!("bench-agent-{index}")
}

/// Every agent's registrations, each with its own Dataplane.
fn registrations_yaml(agents: usize, per_agent: usize, uid: u32) -> String {
    let labels = BTreeMap::from([("app".to_owned(), "bench".to_owned())]);
    let mut documents = Vec::with_capacity(agents * per_agent);
    for a in 0..agents {
        for r in 0..per_agent {
            let name = format!("a{a}-w{r}");
            let document = registered_workload(MESH, &name, "bench", &labels, uid);
            documents.push(format!("{document}  agent: {}\n", agent(a)));
        }
    }
    documents.join("---\n")
}

/// What one run measured (the agents are its streams).
pub type Outcome = harness::Outcome;

/// Runs the whole bench against a fresh in-process daemon.
pub async fn measure(options: &Options) -> anyhow::Result<Outcome> {
    let agents = options.run.streams;
    let sandbox = Sandbox::new()?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    let uid = rustix::process::geteuid().as_raw();
    sandbox.write_resource(
        "workloads.yaml",
        &registrations_yaml(agents, options.registrations, uid),
    )?;
    let settings = sandbox.settings();
    harness::with_daemon(&sandbox, settings, async |daemon, sandbox, clients| {
        let target = daemon
            .unix_target()
            .context("the bench daemon has no unix SDS socket")?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_secs();
        let plans = (0..agents)
            .map(|index| {
                let claims = meshca_auth::Claims::new_agent(
                    agent(index),
                    Duration::from_secs(24 * 3600),
                    now,
                )?;
                Ok(AgentPlan {
                    token: daemon.mint_token(&claims)?,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let plan = FleetPlan {
            target,
            connections: options.run.connections,
            streams: Streams::Agents { agents: plans },
        };
        harness::idle_then_rotate(daemon, sandbox, clients, plan, options.run).await
    })
    .await
}

/// The JSON line of a run: `streams` are the agents, `bytes_per_idle_stream` the daemon's memory per
/// connected agent, `svid_*` the time until every certificate of an agent came from ca-2.
fn report(options: &Options, outcome: &Outcome) -> serde_json::Value {
    let agents = options.run.streams;
    let registrations = agents * options.registrations;
    let grown = outcome
        .idle
        .rss_idle
        .saturating_sub(outcome.idle.rss_before) as f64;
    let own = serde_json::json!({
        "bench": "agents",
        "agents": agents,
        "registrations_per_agent": options.registrations,
        "bytes_per_registration": (grown / registrations as f64).round(),
    });
    let measured = (&outcome.idle, &outcome.rotation, outcome.generations);
    harness::report(&options.run, "svid", measured, own)
}

/// `meshca bench agents`: prints one JSON line; exit 1 unless the rotation reached every agent (and
/// renewed every certificate) in time.
pub async fn run(args: AgentsArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(&args)?;
    let outcome = measure(&options).await?;
    let reach = &outcome.rotation.reach;
    let error = harness::unfinished(
        reach,
        &options.run,
        "agents had every certificate renewed by ca-2",
    );
    Ok(harness::conclude(&report(&options, &outcome), error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        let args = |agents, registrations| AgentsArgs {
            agents,
            registrations,
            ..AgentsArgs::default()
        };
        let o = Options::from_args(&args(1_000, 1)).expect("the defaults");
        assert_eq!((o.run.streams, o.run.connections), (1_000, 1_000));
        for (a, r) in [(0, 1), (1, 0), (1_000, 101)] {
            let e = Options::from_args(&args(a, r)).expect_err("refused");
            assert!(
                e.to_string().contains("--agents and --registrations"),
                "{e}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rotation_reaches_every_agent_and_renews_every_certificate() {
        let mut run = RunOptions::in_process(6, 6);
        run.timeout = Duration::from_secs(60);
        let options = Options {
            registrations: 3,
            run,
        };
        let outcome = measure(&options).await.expect("the bench runs");
        let reach = &outcome.rotation.reach;
        assert_eq!(reach.failed, 0, "{:?}", reach.first_error);
        assert_eq!(reach.reached, 6);
        assert_eq!(
            reach.identity_reached, 6,
            "every certificate renewed by ca-2"
        );
        let line = report(&options, &outcome);
        assert_eq!(line["bench"], "agents");
        assert_eq!(line["agents"], 6);
        assert_eq!(line["registrations_per_agent"], 3);
        assert_eq!(line["svid_reached"], 6);
    }
}
