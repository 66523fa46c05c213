//! What `bench sds` and `bench workload` share: the mesh they rotate, the fleet wherever it runs,
//! and the two halves of a run around the daemon (the streams opened and left idle, then the rotation).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use meshca_config::Settings;
use meshca_daemon::{Daemon, DaemonOptions, Error};
use serde_json::json;

use super::child::ChildFleet;
use super::fleet::{FleetPlan, Reach, StreamFleet};
use super::{cpu_seconds, quantile, rss_bytes};
use crate::sandbox::Sandbox;

/// The mesh the benches run in.
pub const MESH: &str = "default";

fn backend(name: &str) -> String {
    format!(
        "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 24h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
    )
}

/// The Mesh on ca-1 alone, or switched to ca-2 with ca-1 still trusted.
pub(super) fn mesh_yaml(switched: bool) -> String {
    let (enabled, secondary, backends) = if switched {
        (
            "ca-2",
            "  secondaryBackends: [ca-1]\n",
            backend("ca-1") + &backend("ca-2"),
        )
    } else {
        ("ca-1", "", backend("ca-1"))
    };
    format!("type: Mesh\nname: {MESH}\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

/// A duration option in seconds (`name` for the error): positive, or zero when `zero_ok`.
pub(super) fn seconds(name: &str, value: f64, zero_ok: bool) -> Result<Duration, Error> {
    let ok = value.is_finite() && (value > 0.0 || (zero_ok && value == 0.0));
    ok.then(|| Duration::from_secs_f64(value)).ok_or_else(|| {
        Error::invalid_input(format!(
            "{name} must be a positive number of seconds, got {value}"
        ))
    })
}

/// How many connections carry `streams`: `asked`, or `default` or as many as the daemon's
/// `limits.streamsPerConnection` (which the benches leave at its default) needs; an error names the
/// limit a size would hit, rather than leaving streams to wait for a slot that never comes.
fn connections(streams: usize, asked: Option<usize>, default: usize) -> Result<usize, Error> {
    let per_connection = Settings::default().limits.streams_per_connection as usize;
    let connections = asked.unwrap_or_else(|| streams.div_ceil(per_connection).max(default));
    if streams == 0 || connections == 0 {
        return Err(Error::invalid_input(
            "--streams and --connections must be at least 1",
        ));
    }
    if streams.div_ceil(connections) > per_connection {
        return Err(Error::invalid_input(format!(
            "--streams {streams} over --connections {connections} puts more than limits.streamsPerConnection ({per_connection}) streams on a connection: use at least --connections {}",
            streams.div_ceil(per_connection)
        )));
    }
    Ok(connections)
}

/// How a bench runs, whatever its streams ask for.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Concurrent streams.
    pub streams: usize,
    /// HTTP/2 connections carrying them.
    pub connections: usize,
    /// How long the streams stay idle before the memory is read.
    pub idle: Duration,
    /// How long setup, and then the rotation, may take.
    pub timeout: Duration,
    /// Where the clients run.
    pub client: BenchClient,
}

impl RunOptions {
    /// From the command line's `--streams`, `--connections` (default: `default_connections`, see
    /// [`connections`]), `--seconds` (zero allowed) and `--timeout`.
    pub(super) fn new(
        (streams, connections, default_connections): (usize, Option<usize>, usize),
        (seconds, timeout): (f64, f64),
        client: BenchClient,
    ) -> Result<RunOptions, Error> {
        Ok(RunOptions {
            streams,
            connections: self::connections(streams, connections, default_connections)?,
            idle: self::seconds("--seconds", seconds, true)?,
            timeout: self::seconds("--timeout", timeout, false)?,
            client,
        })
    }
}

impl RunOptions {
    /// A small run for tests: clients in this process, no idle time, a minute to finish.
    #[cfg(test)]
    pub(super) fn in_process(streams: usize, connections: usize) -> RunOptions {
        RunOptions {
            streams,
            connections,
            idle: Duration::ZERO,
            timeout: Duration::from_secs(60),
            client: BenchClient::InProcess,
        }
    }
}

/// Where a bench runs its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchClient {
    /// A child process (`meshca bench sds-client`).
    Process,
    /// The bench's own process, beside the daemon.
    InProcess,
}

impl BenchClient {
    /// Its name in a report.
    pub(super) fn name(self) -> &'static str {
        match self {
            BenchClient::Process => "process",
            BenchClient::InProcess => "in-process",
        }
    }
}

/// The fleet, wherever it runs.
pub(super) enum Clients {
    Local(StreamFleet, Instant),
    Child(Box<ChildFleet>),
}

impl Clients {
    async fn start(
        plan: FleetPlan,
        client: BenchClient,
        timeout: Duration,
    ) -> anyhow::Result<Clients> {
        Ok(match client {
            BenchClient::InProcess => {
                Clients::Local(StreamFleet::open(plan).await?, Instant::now())
            }
            BenchClient::Process => {
                Clients::Child(Box::new(ChildFleet::spawn(plan, timeout).await?))
            }
        })
    }

    /// Setup seconds and, for a child, its memory.
    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<(f64, Option<u64>)> {
        match self {
            Clients::Local(fleet, started) => {
                fleet.wait_ready(timeout).await?;
                Ok((started.elapsed().as_secs_f64(), None))
            }
            Clients::Child(child) => {
                let (setup, rss) = child.wait_ready().await?;
                Ok((setup, Some(rss)))
            }
        }
    }

    pub(super) async fn arm(&mut self) -> anyhow::Result<()> {
        match self {
            Clients::Local(fleet, _) => {
                fleet.arm();
                Ok(())
            }
            Clients::Child(child) => child.arm().await,
        }
    }

    pub(super) async fn wait_reached(&mut self, timeout: Duration) -> anyhow::Result<Reach> {
        match self {
            Clients::Local(fleet, _) => Ok(fleet.wait_reached(timeout).await),
            Clients::Child(child) => child.wait_reached().await,
        }
    }

    /// The CPU seconds the client process has used so far (clients in their own process only).
    fn cpu_seconds(&self) -> anyhow::Result<Option<f64>> {
        match self {
            Clients::Local(..) => Ok(None),
            Clients::Child(child) => {
                let pid = child
                    .pid()
                    .ok_or_else(|| anyhow!("the client process has exited"))?;
                cpu_seconds(Some(pid)).map(Some)
            }
        }
    }

    pub(super) async fn stop(self) {
        match self {
            Clients::Local(fleet, _) => fleet.stop().await,
            Clients::Child(child) => child.stop().await,
        }
    }
}

/// Starts a daemon with `settings` (its files in `sandbox`), runs `play` against it with a place for
/// the fleet, then stops the fleet and the daemon whatever `play` returned.
pub(super) async fn with_daemon<T>(
    sandbox: &Sandbox,
    settings: Settings,
    play: impl AsyncFnOnce(&Daemon, &Sandbox, &mut Option<Clients>) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let daemon = Daemon::start(
        settings,
        DaemonOptions {
            gate: true,
            watch_files: false,
        },
    )
    .await?;
    let mut clients = None;
    let result = play(&daemon, sandbox, &mut clients).await;
    if let Some(clients) = clients {
        clients.stop().await;
    }
    daemon.stop().await;
    result
}

/// The fleet with every stream open and idle: how long it took, and the memory.
#[derive(Debug)]
pub struct Idle {
    /// Seconds until every stream held what it asked for.
    pub setup_seconds: f64,
    /// The bench process before any stream.
    pub rss_before: u64,
    /// The bench process with every stream open and idle.
    pub rss_idle: u64,
    /// The client process with every stream open and idle (clients in their own process only).
    pub client_rss_idle: Option<u64>,
}

/// Opens `plan`'s streams (into `clients`, where the options say), waits until each holds what it
/// asked for, leaves them idle and reads the memory.
pub(super) async fn open_idle(
    plan: FleetPlan,
    RunOptions {
        idle,
        timeout,
        client,
        ..
    }: RunOptions,
    clients: &mut Option<Clients>,
) -> anyhow::Result<(Idle, &mut Clients)> {
    let streams = plan.streams.counts().0;
    // Held until the idle memory is read, so that its freed copy cannot make room for the streams.
    let kept = plan.clone();
    let rss_before = rss_bytes(None)?;
    let fleet = clients.insert(Clients::start(plan, client, timeout).await?);
    let (setup_seconds, client_rss_idle) = fleet.wait_ready(timeout).await?;
    tracing::info!(
        streams,
        setup_seconds,
        "bench: every stream holds its secrets"
    );
    tokio::time::sleep(idle).await;
    let rss_idle = rss_bytes(None)?;
    drop(kept);
    let idle = Idle {
        setup_seconds,
        rss_before,
        rss_idle,
        client_rss_idle,
    };
    Ok((idle, fleet))
}

/// What a bench of idle streams and a rotation measured.
#[derive(Debug)]
pub struct Outcome {
    /// The streams opened and idle.
    pub idle: Idle,
    /// The rotation.
    pub rotation: Rotation,
    /// Snapshots the daemon published while the streams opened, and during the rotation.
    pub generations: (u64, u64),
}

/// Opens `plan`'s streams and leaves them idle ([`open_idle`]), then rotates ([`rotate`]), counting the
/// snapshots the daemon published during each.
pub(super) async fn idle_then_rotate(
    daemon: &Daemon,
    sandbox: &Sandbox,
    clients: &mut Option<Clients>,
    plan: FleetPlan,
    run: RunOptions,
) -> anyhow::Result<Outcome> {
    let start_generation = daemon.generation();
    let (idle, fleet) = open_idle(plan, run, clients).await?;
    let idle_generation = daemon.generation();
    let rotation = rotate(daemon, sandbox, fleet, run.timeout).await?;
    Ok(Outcome {
        idle,
        rotation,
        generations: (
            idle_generation - start_generation,
            daemon.generation() - idle_generation,
        ),
    })
}

/// How a rotation went.
#[derive(Debug)]
pub struct Rotation {
    /// How long `reload_resources` took (load, reconcile, publish).
    pub reload_seconds: f64,
    /// How the rotation reached the streams.
    pub reach: Reach,
    /// The CPU seconds the daemon and the client process used from the switch to ca-2 until the rotation
    /// had reached every stream (clients in their own process only: otherwise the two share one).
    pub cpu: Option<(f64, f64)>,
}

/// Switches the mesh to ca-2 (ca-1 kept as secondary) with the fleet's clock armed, and waits until
/// the rotation reached every stream or `timeout`.
pub(super) async fn rotate(
    daemon: &Daemon,
    sandbox: &Sandbox,
    fleet: &mut Clients,
    timeout: Duration,
) -> anyhow::Result<Rotation> {
    sandbox.write_resource("mesh.yaml", &mesh_yaml(true))?;
    fleet.arm().await?;
    // The bench process is the daemon's alone when the clients run in their own.
    let cpu = |fleet: &Clients| -> anyhow::Result<Option<(f64, f64)>> {
        let Some(client) = fleet.cpu_seconds()? else {
            return Ok(None);
        };
        Ok(Some((cpu_seconds(None)?, client)))
    };
    let cpu_before = cpu(fleet)?;
    let reload_started = Instant::now();
    reload(daemon, "the switch to ca-2").await?;
    let reload_seconds = reload_started.elapsed().as_secs_f64();
    let reach = fleet.wait_reached(timeout).await?;
    let cpu = match (cpu_before, cpu(fleet)?) {
        (Some((daemon0, client0)), Some((daemon1, client1))) => {
            Some((daemon1 - daemon0, client1 - client0))
        }
        _ => None,
    };
    Ok(Rotation {
        reload_seconds,
        reach,
        cpu,
    })
}

/// Has the daemon reload its resources; an error when it rejects them (`what` names the edit).
pub(super) async fn reload(daemon: &Daemon, what: &str) -> anyhow::Result<()> {
    match daemon.reload_resources().await? {
        Ok(()) => Ok(()),
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(anyhow!("the daemon rejected {what}: {}", lines.join("; ")))
        }
    }
}

pub(super) fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

/// A bench's report: the fields both benches have, `identity` naming the latencies of the streams'
/// own certificates (`identity` for SDS, `svid` for the Workload API), with the snapshots published
/// during setup and during the rotation, and the bench's `own` (an object).
pub(super) fn report(
    run: &RunOptions,
    identity: &str,
    (idle, rotation, generations): (&Idle, &Rotation, (u64, u64)),
    own: serde_json::Value,
) -> serde_json::Value {
    let streams = run.streams;
    let ms = |v: Option<f64>| v.map(|v| round(v, 4));
    let reach = &rotation.reach;
    let per_stream = idle.rss_idle.saturating_sub(idle.rss_before) as f64 / streams as f64;
    let mut fields: serde_json::Map<String, serde_json::Value> = [
        ("streams", json!(streams)),
        ("connections", json!(run.connections)),
        ("client", json!(run.client.name())),
        ("setup_seconds", json!(round(idle.setup_seconds, 3))),
        ("rss_before_bytes", json!(idle.rss_before)),
        ("rss_idle_bytes", json!(idle.rss_idle)),
        ("bytes_per_idle_stream", json!(per_stream.round())),
        ("client_rss_idle_bytes", json!(idle.client_rss_idle)),
        ("reload_seconds", json!(round(rotation.reload_seconds, 4))),
        (
            "rotation_p50_seconds",
            json!(ms(quantile(&reach.latencies, 0.5))),
        ),
        (
            "rotation_p99_seconds",
            json!(ms(quantile(&reach.latencies, 0.99))),
        ),
        (
            "rotation_max_seconds",
            json!(ms(reach.latencies.last().copied())),
        ),
        ("reached", json!(reach.reached)),
        (
            "daemon_cpu_rotation_seconds",
            json!(rotation.cpu.map(|(d, _)| round(d, 2))),
        ),
        (
            "client_cpu_rotation_seconds",
            json!(rotation.cpu.map(|(_, c)| round(c, 2))),
        ),
        ("failed", json!(reach.failed)),
        ("responses_rotation", json!(reach.responses)),
        ("snapshots_setup", json!(generations.0)),
        ("snapshots_rotation", json!(generations.1)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    for (name, value) in [
        ("p50", ms(quantile(&reach.identity_latencies, 0.5))),
        ("p99", ms(quantile(&reach.identity_latencies, 0.99))),
        ("max", ms(reach.identity_latencies.last().copied())),
    ] {
        fields.insert(format!("{identity}_{name}_seconds"), value.into());
    }
    fields.insert(format!("{identity}_reached"), reach.identity_reached.into());
    if let serde_json::Value::Object(own) = own {
        fields.extend(own);
    }
    serde_json::Value::Object(fields)
}

/// Prints a run's report (one JSON line) and, if it failed, `error`: exit 1 then.
pub(super) fn conclude(report: &serde_json::Value, error: Option<String>) -> ExitCode {
    println!("{report}");
    match error {
        None => ExitCode::SUCCESS,
        Some(error) => {
            eprintln!("error: {error}");
            ExitCode::from(1)
        }
    }
}

/// The error of a run whose rotation did not reach every one of its streams, or did not renew the
/// identity of every one, within its timeout; `renewed` says what was renewed (`SVIDs were renewed by
/// ca-2`).
pub(super) fn unfinished(reach: &Reach, run: &RunOptions, renewed: &str) -> Option<String> {
    unreached(reach, run).or_else(|| {
        (reach.identity_reached != run.streams).then(|| {
            format!(
                "{} of {} {renewed} within {:?}",
                reach.identity_reached, run.streams, run.timeout
            )
        })
    })
}

/// The error of a run whose rotation did not reach every one of its streams within its timeout.
pub(super) fn unreached(reach: &Reach, run: &RunOptions) -> Option<String> {
    let (streams, timeout) = (run.streams, run.timeout);
    (reach.reached != streams).then(|| {
        format!(
            "the rotation reached {} of {streams} streams within {timeout:?} ({} failed); first error: {}",
            reach.reached,
            reach.failed,
            reach.first_error.as_deref().unwrap_or("none reported"),
        )
    })
}
