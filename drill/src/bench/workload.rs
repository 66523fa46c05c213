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
use super::harness::{self, mesh_yaml, round, seconds, BenchClient, Idle, Rotation, MESH};
use crate::sandbox::Sandbox;
use crate::scenario::registered_workload;

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
    /// `workloadApi.ackAfter` of the bench daemon, in seconds.
    pub ack_after: f64,
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
    /// Concurrent streams.
    pub streams: usize,
    /// HTTP/2 connections carrying them.
    pub connections: usize,
    /// The daemon's `workloadApi.ackAfter`.
    pub ack_after: Duration,
    /// How long the streams stay idle before the memory is read.
    pub idle: Duration,
    /// How long setup, and then the rotation, may take.
    pub timeout: Duration,
    /// Where the clients run.
    pub client: BenchClient,
}

impl Options {
    fn from_args(args: &WorkloadArgs) -> Result<Options, Error> {
        // The streams of one connection are bounded by a limit the bench leaves as it is (it is
        // the SDS socket's too): say when a size would hit it.
        let per_connection = Settings::default().limits.streams_per_connection as usize;
        let connections = args.connections.unwrap_or_else(|| {
            args.streams
                .div_ceil(per_connection)
                .max(DEFAULT_CONNECTIONS)
        });
        if args.streams == 0 || connections == 0 {
            return Err(Error::invalid_input(
                "--streams and --connections must be at least 1",
            ));
        }
        if args.streams.div_ceil(connections) > per_connection {
            return Err(Error::invalid_input(format!(
                "--streams {} over --connections {connections} puts more than limits.streamsPerConnection ({per_connection}) streams on a connection: use at least --connections {}",
                args.streams,
                args.streams.div_ceil(per_connection)
            )));
        }
        if u32::try_from(args.streams).is_err() || u32::try_from(connections).is_err() {
            return Err(Error::invalid_input(
                "--streams and --connections must be below 2^32",
            ));
        }
        Ok(Options {
            streams: args.streams,
            connections,
            ack_after: seconds("--ack-after", args.ack_after, true)?,
            idle: seconds("--seconds", args.seconds, true)?,
            timeout: seconds("--timeout", args.timeout, false)?,
            client: args.client,
        })
    }

    /// The bench daemon's settings: the sandbox's, with room for every stream and connection of one
    /// process, and the bench's `workloadApi.ackAfter`.
    fn settings(&self, sandbox: &Sandbox) -> Settings {
        let mut settings = sandbox.settings();
        let limits = &mut settings.limits;
        let at_least = |limit: &mut u32, wanted: usize| {
            *limit = (*limit).max(u32::try_from(wanted).unwrap_or(u32::MAX));
        };
        at_least(&mut limits.workload_streams_per_caller, self.streams);
        at_least(&mut limits.workload_connections, self.connections);
        settings.workload_api.ack_after = meshca_config::Duration(self.ack_after);
        settings
    }
}

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    /// The streams opened and idle.
    pub idle: Idle,
    /// The rotation.
    pub rotation: Rotation,
    /// Snapshots the daemon published while the streams opened, and during the rotation.
    pub generations: (u64, u64),
}

/// Runs the whole bench against a fresh in-process daemon.
pub async fn measure(options: &Options) -> anyhow::Result<Outcome> {
    let sandbox = Sandbox::new()?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    let uid = rustix::process::geteuid().as_raw();
    let labels = BTreeMap::from([("app".to_owned(), "bench".to_owned())]);
    sandbox.write_resource(
        "workload.yaml",
        &registered_workload(MESH, WORKLOAD, "bench", &labels, uid),
    )?;
    let settings = options.settings(&sandbox);
    let socket = settings
        .workload_api
        .listen
        .first()
        .ok_or_else(|| anyhow!("the bench daemon has no Workload API socket"))?;
    let target = format!("unix://{}", socket.display());
    harness::with_daemon(&sandbox, settings, async |daemon, sandbox, clients| {
        let plan = FleetPlan {
            target,
            connections: options.connections,
            streams: Streams::Workload {
                count: options.streams,
            },
        };
        let start_generation = daemon.generation();
        let (idle, fleet) =
            harness::open_idle(plan, options.client, options.idle, options.timeout, clients)
                .await?;
        let idle_generation = daemon.generation();
        let rotation = harness::rotate(daemon, sandbox, fleet, options.timeout).await?;
        Ok(Outcome {
            idle,
            rotation,
            generations: (
                idle_generation - start_generation,
                daemon.generation() - idle_generation,
            ),
        })
    })
    .await
}

/// The JSON line of a run.
fn report(options: &Options, outcome: &Outcome) -> serde_json::Value {
    let mut line = harness::report_fields(
        options.streams,
        options.client,
        "svid",
        &outcome.idle,
        &outcome.rotation,
    );
    let own = serde_json::json!({
        "bench": "workload",
        "connections": options.connections,
        "ack_after_seconds": round(options.ack_after.as_secs_f64(), 3),
        "snapshots_setup": outcome.generations.0,
        "snapshots_rotation": outcome.generations.1,
    });
    if let serde_json::Value::Object(own) = own {
        line.extend(own);
    }
    serde_json::Value::Object(line)
}

/// `meshca bench workload`: prints one JSON line; exit 1 unless the rotation reached every stream (and
/// renewed every SVID) in time.
pub async fn run(args: WorkloadArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(&args)?;
    let outcome = measure(&options).await?;
    println!("{}", report(&options, &outcome));
    let reach = &outcome.rotation.reach;
    let error = harness::unreached(reach, options.streams, options.timeout).or_else(|| {
        (reach.identity_reached != options.streams).then(|| {
            format!(
                "{} of {} SVIDs were renewed by ca-2 within {:?}",
                reach.identity_reached, options.streams, options.timeout
            )
        })
    });
    match error {
        None => Ok(ExitCode::SUCCESS),
        Some(error) => {
            eprintln!("error: {error}");
            Ok(ExitCode::from(1))
        }
    }
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
        assert_eq!((o.connections, o.ack_after), (16, Duration::from_secs(1)));
        let o = Options::from_args(&args(100_000, None)).expect("enough connections by default");
        assert_eq!(o.connections, 98);
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
            streams: 20,
            connections: 3,
            ack_after: Duration::from_millis(50),
            idle: Duration::ZERO,
            timeout: Duration::from_secs(60),
            client: BenchClient::InProcess,
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
    }
}
