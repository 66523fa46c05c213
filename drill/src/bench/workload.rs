//! `meshca bench workload` (BENCHMARKS.md): `bench sds` for the SPIFFE Workload API. An in-process
//! daemon serves mesh `default` from builtin CA ca-1 and one WorkloadRegistration that selects the
//! bench's user (so the client process, of the same user, matches it); N `FetchX509SVID` streams from
//! that one process, the daemon's memory before and after they open, then the edit that switches the
//! mesh to ca-2 (ca-1 kept as secondary) and, per stream, the time from the reload call until a
//! message's bundle holds ca-2, and until its SVID is signed by ca-2.
//!
//! The second step waits for the first to be applied everywhere: the rollout gate counts a Workload
//! API message as applied `workloadApi.ackAfter` after writing it (clients send nothing back). So the
//! SVID latency is that setting plus the daemon's own work; `--ack-after` sets it (default: the
//! daemon's default, 1 s, what operators run), and a run with a small one shows the work alone.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use meshca_config::Settings;
use meshca_daemon::Error;

use super::fleet::{FleetPlan, Streams};
use super::harness::{self, mesh_yaml, round, seconds, BenchClient, RunOptions, MESH};
use crate::agents::Agents;
use crate::sandbox::Sandbox;
use crate::scenario::{agent_name, registered_workload};

/// The Dataplane (and registration) whose identity every stream receives.
const WORKLOAD: &str = "bench-workload";

/// What `meshca bench workload` is asked for, before it is checked.
#[derive(Clone, Debug)]
pub struct WorkloadArgs {
    /// How many concurrent `FetchX509SVID` streams.
    pub streams: usize,
    /// How many HTTP/2 connections carry them; `None`: [`DEFAULT_CONNECTIONS`], or as many as
    /// `limits.streamsPerConnection` needs.
    pub connections: Option<usize>,
    /// `workloadApi.ackAfter` of the bench daemon (of the agent, behind one), in seconds.
    pub ack_after: f64,
    /// How many registrations there are: the streams all match the first, the others select other
    /// uids.
    pub registrations: usize,
    /// Serve the streams through a `meshca agent` that every registration names; `false`: the
    /// daemon's own socket serves them.
    pub agent: bool,
    /// How long the streams stay idle before the memory is read, in seconds.
    pub seconds: f64,
    /// How long the setup, and then the rotation, may take, in seconds.
    pub timeout: f64,
    /// Where the clients run.
    pub client: BenchClient,
}

impl Default for WorkloadArgs {
    /// The defaults of `meshca bench workload`.
    fn default() -> WorkloadArgs {
        WorkloadArgs {
            streams: 10_000,
            connections: None,
            ack_after: meshca_workload::DEFAULT_ACK_AFTER.as_secs_f64(),
            registrations: 1,
            agent: false,
            seconds: 2.0,
            timeout: 60.0,
            client: BenchClient::Process,
        }
    }
}

/// Connections the bench opens unless more are needed or `--connections` says otherwise.
pub const DEFAULT_CONNECTIONS: usize = 16;

/// What to measure, checked.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The daemon's `workloadApi.ackAfter` (the agent's, behind one).
    pub ack_after: Duration,
    /// How many registrations there are (the streams match the first).
    pub registrations: usize,
    /// Through a `meshca agent` that every registration names.
    pub agent: bool,
    /// How it runs.
    pub run: RunOptions,
}

impl Options {
    fn from_args(args: &WorkloadArgs) -> Result<Options, Error> {
        if args.registrations == 0 {
            return Err(Error::invalid_input(
                "--registrations must be at least 1 (the streams match the first)",
            ));
        }
        Ok(Options {
            ack_after: seconds("--ack-after", args.ack_after, true)?,
            registrations: args.registrations,
            agent: args.agent,
            run: RunOptions::new(
                (args.streams, args.connections, DEFAULT_CONNECTIONS),
                (args.seconds, args.timeout),
                args.client,
            )?,
        })
    }

    /// The bench daemon's settings: the sandbox's, with room for every stream and connection of one
    /// process, and the bench's `workloadApi.ackAfter`.
    fn settings(&self, sandbox: &Sandbox) -> Settings {
        let mut settings = settings_for(sandbox, &self.run);
        settings.workload_api.ack_after = meshca_config::Duration(self.ack_after);
        settings
    }
}

/// The sandbox's settings, with room for every stream and connection of `run` from one process.
pub(super) fn settings_for(sandbox: &Sandbox, run: &RunOptions) -> Settings {
    let mut settings = sandbox.settings();
    let limits = &mut settings.limits;
    let at_least = |limit: &mut u32, wanted: usize| {
        *limit = (*limit).max(u32::try_from(wanted).unwrap_or(u32::MAX));
    };
    at_least(&mut limits.workload_streams_per_caller, run.streams);
    at_least(&mut limits.workload_connections, run.connections);
    // Every stream comes from this one user.
    at_least(&mut limits.workload_connections_per_uid, run.connections);
    settings
}

/// The registration of [`WORKLOAD`] that the bench's process (of user `uid`) matches.
pub(super) fn bench_registration(uid: u32) -> String {
    let labels = BTreeMap::from([("app".to_owned(), "bench".to_owned())]);
    registered_workload(MESH, WORKLOAD, "bench", &labels, uid)
}

/// What one run measured.
pub type Outcome = harness::Outcome;

/// Runs the whole bench against a fresh in-process daemon.
pub async fn measure(options: &Options) -> anyhow::Result<Outcome> {
    let sandbox = Sandbox::new()?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    let uid = rustix::process::geteuid().as_raw();
    sandbox.write_resource("workload.yaml", &workloads_yaml(options, uid))?;
    let settings = options.settings(&sandbox);
    let socket = settings
        .workload_api
        .listen
        .first()
        .ok_or_else(|| anyhow!("the bench daemon has no Workload API socket"))?
        .clone();
    let sds = settings
        .sds
        .listen
        .iter()
        .find_map(|l| match l {
            meshca_config::ListenAddr::Unix(path) => Some(path.clone()),
            _ => None,
        })
        .ok_or_else(|| anyhow!("the bench daemon has no unix SDS socket"))?;
    harness::with_daemon(&sandbox, settings, async |daemon, sandbox, clients| {
        let agent = if options.agent {
            Some(start_agent(options, daemon, sandbox, sds).await?)
        } else {
            None
        };
        let socket = agent.as_ref().map_or(socket, |a| a.sockets()[0].clone());
        let result = rotate_through(options, daemon, sandbox, clients, socket).await;
        if let Some(agent) = agent {
            // The fleet goes first: an agent stopping under open streams would end them.
            if let Some(clients) = clients.take() {
                clients.stop().await;
            }
            agent.stop().await;
        }
        result
    })
    .await
}

/// The registrations: `WORKLOAD`, which the bench's process matches, and the others for other uids;
/// behind an agent, every one names it.
fn workloads_yaml(options: &Options, uid: u32) -> String {
    let labels = BTreeMap::from([("app".to_owned(), "bench".to_owned())]);
    let agent = if options.agent {
        format!("  agent: {}\n", agent_name(0))
    } else {
        String::new()
    };
    (0..options.registrations)
        .map(|i| {
            let (name, uid) = match i {
                0 => (WORKLOAD.to_owned(), uid),
                i => (format!("{WORKLOAD}-{i}"), uid.wrapping_add(1 + i as u32)),
            };
            registered_workload(MESH, &name, "bench", &labels, uid) + &agent
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The agent the streams go through, with room for them all and the bench's `ackAfter`.
async fn start_agent(
    options: &Options,
    daemon: &meshca_daemon::Daemon,
    sandbox: &Sandbox,
    sds: std::path::PathBuf,
) -> anyhow::Result<Agents> {
    let mint = |claims: &meshca_auth::Claims| Ok(daemon.mint_token(claims)?);
    let configure = |config: &mut meshca_agent::AgentConfig| {
        config.workload.ack_after = options.ack_after;
        config.workload.streams_per_caller =
            config.workload.streams_per_caller.max(options.run.streams);
        config.workload.connections_per_uid = config
            .workload
            .connections_per_uid
            .max(options.run.connections);
    };
    Agents::start(sandbox.root(), 1, |_| vec![sds.clone()], &mint, &configure).await
}

/// Opens the streams on `socket`, leaves them idle, then rotates.
async fn rotate_through(
    options: &Options,
    daemon: &meshca_daemon::Daemon,
    sandbox: &Sandbox,
    clients: &mut Option<harness::Clients>,
    socket: std::path::PathBuf,
) -> anyhow::Result<Outcome> {
    let plan = FleetPlan {
        target: format!("unix://{}", socket.display()),
        connections: options.run.connections,
        streams: Streams::Workload {
            count: options.run.streams,
            trust_only: false,
        },
    };
    harness::idle_then_rotate(daemon, sandbox, clients, plan, options.run).await
}

/// The JSON line of a run.
fn report(options: &Options, outcome: &Outcome) -> serde_json::Value {
    let own = serde_json::json!({
        "bench": "workload",
        "ack_after_seconds": round(options.ack_after.as_secs_f64(), 3),
        "registrations": options.registrations,
        "agent_registrations": options.agent.then_some(options.registrations),
    });
    let measured = (&outcome.idle, &outcome.rotation, outcome.generations);
    harness::report(&options.run, "svid", measured, own)
}

/// `meshca bench workload`: prints one JSON line; exit 1 unless the rotation reached every stream (and
/// renewed every SVID) in time.
pub async fn run(args: WorkloadArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(&args)?;
    let outcome = measure(&options).await?;
    let reach = &outcome.rotation.reach;
    let error = harness::unfinished(reach, &options.run, "SVIDs were renewed by ca-2");
    Ok(harness::conclude(&report(&options, &outcome), error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_a_connection_limit_would_stop_are_refused_naming_it() {
        let args = |streams: usize, connections: Option<usize>| WorkloadArgs {
            streams,
            connections,
            ..WorkloadArgs::default()
        };
        let o = Options::from_args(&args(10_000, None)).expect("defaults");
        assert_eq!(
            (o.run.connections, o.ack_after),
            (16, Duration::from_secs(1))
        );
        let o = Options::from_args(&args(100_000, None)).expect("enough connections by default");
        assert_eq!(o.run.connections, 98);
        let e = Options::from_args(&args(10_000, Some(4)))
            .expect_err("2,500 streams per connection")
            .to_string();
        assert!(
            e.contains("limits.streamsPerConnection (1024)") && e.contains("--connections 10"),
            "{e}"
        );
        let settings = o.settings(&Sandbox::new().expect("a sandbox"));
        assert_eq!(settings.limits.workload_streams_per_caller, 100_000);
        assert_eq!(settings.limits.workload_connections, 1024, "default kept");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rotation_reaches_every_workload_stream_and_renews_every_svid() {
        let options = Options {
            ack_after: Duration::from_millis(50),
            registrations: 3,
            agent: false,
            run: RunOptions::in_process(20, 3),
        };
        let outcome = measure(&options).await.expect("the bench runs");
        let reach = &outcome.rotation.reach;
        assert_eq!(reach.failed, 0, "{:?}", reach.first_error);
        assert_eq!(reach.reached, 20);
        assert_eq!(reach.latencies.len(), 20);
        assert_eq!(reach.identity_streams, 20);
        assert_eq!(reach.identity_reached, 20, "every SVID renewed by ca-2");
        assert!(
            reach.responses >= 40,
            "the new bundle, then the new SVID, on every stream: {}",
            reach.responses
        );
        assert!(outcome.idle.rss_idle > 0 && outcome.idle.rss_before > 0);
        let line = report(&options, &outcome);
        assert_eq!(line["bench"], "workload");
        assert_eq!(line["reached"], 20);
        assert_eq!(line["svid_reached"], 20);
        assert_eq!(line["ack_after_seconds"], 0.05);
        assert_eq!(line["registrations"], 3);
        assert!(line["agent_registrations"].is_null());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn behind_an_agent_a_rotation_reaches_every_stream_and_renews_every_svid() {
        let options = Options {
            ack_after: Duration::from_millis(50),
            registrations: 5,
            agent: true,
            run: RunOptions::in_process(20, 3),
        };
        let outcome = measure(&options).await.expect("the bench runs");
        let reach = &outcome.rotation.reach;
        assert_eq!(reach.failed, 0, "{:?}", reach.first_error);
        assert_eq!(reach.reached, 20);
        assert_eq!(reach.identity_reached, 20, "every SVID renewed by ca-2");
        let line = report(&options, &outcome);
        assert_eq!(line["agent_registrations"], 5);
        assert_eq!(line["svid_reached"], 20);
    }
}
